#include "strata/optim/SsdStateStream.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "strata/optim/ChunkOptimizer.h"

namespace strata::optim {

StateTensors SsdBuffers::get(size_t set, const zero::NvmeTier& tier, size_t c,
                             const std::array<int64_t, zero::NvmeTier::kStateFields>& least) {
  Tensor out[zero::NvmeTier::kStateFields];
  for (int f = 0; f < zero::NvmeTier::kStateFields; ++f) {
    int64_t n = tier.fieldElems(c, zero::NvmeTier::Field(f));
    if (n == 0) continue;
    Tensor& buffer = buffers_[set][f];
    int64_t size = std::max(n, least[size_t(f)]);
    if (!buffer.defined() || buffer.numel() < size) {
      buffer = Tensor();  // the old one goes first
      DType dt = dtypes_[size_t(f)];
      buffer = pinned_ ? hostStateTensor(size, dt, true) : Tensor::empty({size}, dt, Device::cpu());
    }
    out[f] = buffer.narrow(0, 0, n);
  }
  return StateTensors{out[0], out[1], out[2]};
}

StateTensors SsdBuffers::readNow(zero::NvmeTier& tier, size_t c) {
  StateTensors st = get(0, tier, c);
  tier.wait(tier.readAsync(c, fields(st)));
  return st;
}

std::vector<zero::NvmeTier::FieldValues> SsdBuffers::fields(const StateTensors& state) {
  std::vector<zero::NvmeTier::FieldValues> out;
  const Tensor* values[] = {&state.master, &state.m, &state.v};
  for (int f = 0; f < zero::NvmeTier::kStateFields; ++f)
    if (values[f]->defined())
      out.push_back({zero::NvmeTier::Field(f), values[f]->data(), values[f]->dtype()});
  return out;
}

SsdStateStream::SsdStateStream(zero::NvmeTier* tier, SsdBuffers& buffers, std::vector<size_t> order,
                               bool readAhead)
    : tier_(tier),
      buffers_(buffers),
      order_(std::move(order)),
      sets_(readAhead ? 2 : 1),
      reads_(order_.size(), 0),
      uncaught_(std::uncaught_exceptions()) {
  STRATA_CHECK(order_.empty() || tier_ != nullptr, "{} chunks are placed on the SSD tier, which is missing",
               order_.size());
  for (size_t c : order_)
    for (int f = 0; f < zero::NvmeTier::kStateFields; ++f)
      largest_[size_t(f)] = std::max(largest_[size_t(f)], tier_->fieldElems(c, zero::NvmeTier::Field(f)));
}

SsdStateStream::~SsdStateStream() {
  if (!order_.empty() && std::uncaught_exceptions() > uncaught_) tier_->drain();
}

void SsdStateStream::readUpTo(size_t upTo) {
  for (; readsIssued_ < std::min(upTo, order_.size()); ++readsIssued_) {
    size_t c = order_[readsIssued_];
    reads_[readsIssued_] =
        tier_->readAsync(c, SsdBuffers::fields(buffers_.get(readsIssued_ % sets_, *tier_, c, largest_)));
  }
}

void SsdStateStream::start() {
  readUpTo(sets_ - 1);
}

StateTensors SsdStateStream::acquire(size_t k) {
  readUpTo(k + sets_);
  auto start = std::chrono::steady_clock::now();
  tier_->wait(reads_[k]);
  waitSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return buffers_.get(k % sets_, *tier_, order_[k], largest_);
}

void SsdStateStream::release(size_t k, const StateTensors& state) {
  written_ = tier_->writeAsync(order_[k], SsdBuffers::fields(state));
}

void SsdStateStream::finish() {
  auto start = std::chrono::steady_clock::now();
  if (written_ != 0) tier_->wait(written_);
  waitSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace strata::optim
