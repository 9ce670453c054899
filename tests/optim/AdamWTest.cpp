#include <cmath>
#include <filesystem>

#include "TestUtil.h"
#include "strata/optim/AdamW.h"
#include "strata/optim/LossScaler.h"
#include "strata/optim/LrSchedule.h"

using namespace strata;
namespace fs = std::filesystem;

TEST_CASE("AdamW matches a scalar reference over several steps", "[optim][adamw]") {
  Tensor w = Tensor::fromVector<float>({0.5f, -1.0f, 2.0f, 0.25f}, {2, 2});
  w.setRequiresGrad(true);
  Tensor b = Tensor::fromVector<float>({0.1f, -0.2f}, {2});
  b.setRequiresGrad(true);
  optim::AdamWConfig cfg{0.01, 0.9, 0.95, 1e-8, 0.1};
  optim::AdamW opt({{"w", w}, {"b", b}}, cfg);
  std::vector<double> rw = {0.5, -1.0, 2.0, 0.25}, rb = {0.1, -0.2};
  std::vector<double> mw(4, 0), vw(4, 0), mb(2, 0), vb(2, 0);
  for (int step = 1; step <= 5; ++step) {
    // loss = sum(w^2) + 3 sum(b): grads 2w and 3.
    backward(sum(w * w) + sum(b) * 3.0);
    opt.step(cfg.lr);
    opt.zeroGrad();
    double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.95, step);
    for (int i = 0; i < 4; ++i) {
      double g = 2 * rw[i];
      mw[i] = 0.9 * mw[i] + 0.1 * g;
      vw[i] = 0.95 * vw[i] + 0.05 * g * g;
      rw[i] = rw[i] * (1 - 0.01 * 0.1) - 0.01 * (mw[i] / c1) / (std::sqrt(vw[i] / c2) + 1e-8);
    }
    for (int i = 0; i < 2; ++i) {  // biases get no weight decay
      double g = 3;
      mb[i] = 0.9 * mb[i] + 0.1 * g;
      vb[i] = 0.95 * vb[i] + 0.05 * g * g;
      rb[i] = rb[i] - 0.01 * (mb[i] / c1) / (std::sqrt(vb[i] / c2) + 1e-8);
    }
  }
  REQUIRE(test::closeness(w.toVector<double>(), rw, 1e-6, 1e-5) <= 1.0);
  REQUIRE(test::closeness(b.toVector<double>(), rb, 1e-6, 1e-5) <= 1.0);
  REQUIRE(opt.stepCount() == 5);
  REQUIRE(opt.namedState().size() == 4);
  REQUIRE(opt.namedState()[0].first == "m.w");
}

TEST_CASE("gradient norm and clipping coefficient", "[optim][clip]") {
  Tensor a = ops::zeros({2});
  a.setRequiresGrad(true);
  Tensor b = ops::zeros({1});
  b.setRequiresGrad(true);
  a.setGrad(Tensor::fromVector<float>({3, 0}, {2}));
  b.setGrad(Tensor::fromVector<float>({4}, {1}));
  Tensor norm = optim::gradNorm({a, b}, Device::cpu());
  REQUIRE(norm.item() == Approx(5.0));
  REQUIRE(optim::clipCoefficient(norm, 1.0).item() == Approx(0.2).epsilon(1e-5));
  REQUIRE(optim::clipCoefficient(norm, 10.0).item() == 1.0);
}

TEST_CASE("learning-rate schedules warm up and decay to min_lr", "[optim][schedule]") {
  optim::LrSchedule cosine{optim::LrStyle::Cosine, 1.0, 0.1, 10, 110};
  REQUIRE(cosine.at(0) == Approx(0.1));
  REQUIRE(cosine.at(9) == Approx(1.0));
  REQUIRE(cosine.at(10) == Approx(1.0));
  REQUIRE(cosine.at(60) == Approx(0.55));
  REQUIRE(cosine.at(110) == Approx(0.1));
  REQUIRE(cosine.at(500) == Approx(0.1));
  optim::LrSchedule linear{optim::LrStyle::Linear, 1.0, 0.0, 0, 100};
  REQUIRE(linear.at(50) == Approx(0.5));
  optim::LrSchedule constant{optim::LrStyle::Constant, 0.3, 0.0, 5, 100};
  REQUIRE(constant.at(2) == Approx(0.18));
  REQUIRE(constant.at(99) == Approx(0.3));
  REQUIRE_THROWS_AS(optim::lrStyleFromName("step"), Error);
}

TEST_CASE("dynamic loss scaling halves on overflow and grows after a window", "[optim][lossscale]") {
  optim::LossScaler scaler(optim::LossScalerConfig{1024.0, 3, 256.0});
  REQUIRE(scaler.scale() == 1024.0);
  REQUIRE_FALSE(scaler.update(INFINITY));
  REQUIRE(scaler.scale() == 512.0);
  REQUIRE_FALSE(scaler.update(NAN));
  REQUIRE_FALSE(scaler.update(INFINITY));
  REQUIRE(scaler.scale() == 256.0);  // never below the minimum
  REQUIRE(scaler.skippedSteps() == 3);
  REQUIRE(scaler.update(10.0));
  REQUIRE(scaler.update(10.0));
  REQUIRE(scaler.scale() == 256.0);
  REQUIRE(scaler.update(10.0));  // third good step in a row
  REQUIRE(scaler.scale() == 512.0);
}

TEST_CASE("AdamW over bf16 chunks updates fp32 masters and writes each parameter as its master rounded",
          "[optim][adamw][chunks]") {
  Generator gen(11);
  Tensor w = ops::rand({16, 8}, gen, DType::F32, Device::cpu(), -0.5, 0.5);
  Tensor b = ops::rand({8}, gen, DType::F32, Device::cpu(), -0.5, 0.5);
  // The reference: per-parameter AdamW on fp32 tensors with the same values and gradients.
  Tensor rw = w.clone(), rb = b.clone();
  for (Tensor* t : {&w, &b, &rw, &rb}) t->setRequiresGrad(true);
  optim::AdamWConfig cfg{0.05, 0.9, 0.95, 1e-8, 0.1};
  optim::AdamW ref({{"w", rw}, {"b", rb}}, cfg);
  zero::ChunkManager chunks({{"w", w}, {"b", b}}, 1 << 20, DType::BF16);
  REQUIRE(w.dtype() == DType::BF16);
  REQUIRE(w.storage() == chunks.storage(0));
  optim::AdamW opt(chunks, chunks.takeMasters(), cfg);
  REQUIRE(opt.hasMaster(0));
  auto masters = opt.namedMasters();
  REQUIRE(masters.size() == 2);
  REQUIRE(masters[0].first == "w");
  REQUIRE(masters[0].second.dtype() == DType::F32);
  // The masters start as the fp32 values, exactly.
  REQUIRE(masters[0].second.toVector<float>() == rw.toVector<float>());
  for (int step = 0; step < 3; ++step) {
    for (auto [p, r] : {std::pair{w, rw}, std::pair{b, rb}}) {
      Tensor g = ops::rand(p.shape(), gen, DType::F32, Device::cpu(), -1, 1);
      ops::copy(autograd::claimGradBuffer(p).buffer, g);
      r.setGrad(g);
    }
    opt.step(0.05);
    ref.step(0.05);
    opt.zeroGrad();
    ref.zeroGrad();
    REQUIRE(!w.grad().defined());
    REQUIRE(masters[0].second.toVector<float>() == rw.toVector<float>());
    REQUIRE(masters[1].second.toVector<float>() == rb.toVector<float>());
    // Bit for bit what a fresh cast gives.
    REQUIRE(w.toVector<double>() == rw.to(DType::BF16).toVector<double>());
    REQUIRE(b.toVector<double>() == rb.to(DType::BF16).toVector<double>());
  }
  // The state is per chunk.
  auto state = opt.namedState();
  REQUIRE(state.size() == 2);
  REQUIRE(state[0].first == "exp_avg.0");
  REQUIRE(state[0].second.numel() == chunks.layout().chunks[0].used);
  // A load writes the masters; writeParameters rounds them into the parameters.
  ops::copy(masters[0].second, ops::full({16, 8}, 0.3, DType::F32, Device::cpu()));
  opt.writeParameters();
  REQUIRE(w.toVector<double>() ==
          ops::full({16, 8}, 0.3, DType::F32, Device::cpu()).to(DType::BF16).toVector<double>());
}

TEST_CASE("a backward after an optimizer step rewrote a saved 16-bit parameter fails loudly",
          "[optim][adamw][chunks]") {
  Generator gen(12);
  Tensor w = ops::rand({8, 4}, gen, DType::F32, Device::cpu(), -0.5, 0.5);
  w.setRequiresGrad(true);
  Tensor x = ops::rand({3, 8}, gen, DType::F32, Device::cpu(), -1, 1).to(DType::BF16);
  x.setRequiresGrad(true);
  zero::ChunkManager chunks({{"w", w}}, 1 << 20, DType::BF16);
  optim::AdamW opt(chunks, chunks.takeMasters(), optim::AdamWConfig{});
  Tensor loss = sum(linear(x, w).to(DType::F32));
  backward({loss}, {}, /*retainGraph=*/true);
  opt.step(1e-3);  // rewrites the bf16 weight the graph saved
  std::string message;
  try {
    backward({loss}, {}, true);
  } catch (const Error& e) {
    message = e.what();
  }
  REQUIRE(message.find("written in place after the forward") != std::string::npos);
}

TEST_CASE(
    "AdamW over chunks on the host and SSD tiers, then moved to the device, matches state on the device",
    "[optim][adamw][chunks][store]") {
  // Three bf16 chunks: one stays on the device, one is homed on the host, one on the SSD; after two steps
  // the memory tracer's move brings the off-device ones onto the device. Every step must be bit for bit the
  // all-on-device update (on the CPU both run the same kernel), with m and v in fp32 and in bf16
  // (optimizer.moments_dtype: bf16 in every tier, the SSD's fields included).
  DType momentsDType = GENERATE(DType::F32, DType::BF16);
  INFO("moments " << dtypeName(momentsDType));
  fs::path dir = test::freshDir("strata-adamw-tiers");
  Generator gen(5);
  auto make = [&](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> ps;
    for (const char* name : {"a", "b", "c"}) {
      Tensor t = ops::rand({64, 32}, g, DType::F32, Device::cpu(), -0.5, 0.5);
      t.setRequiresGrad(true);
      ps.emplace_back(name, t);
    }
    return ps;
  };
  Generator g1(7), g2(7);
  auto ps1 = make(g1), ps2 = make(g2);
  int64_t chunkBytes = 64 * 32 * 2;  // one parameter per chunk
  zero::ChunkManager c1(ps1, chunkBytes, DType::BF16), c2(ps2, chunkBytes, DType::BF16);
  REQUIRE(c1.numChunks() == 3);
  optim::AdamWConfig cfg{0.01, 0.9, 0.95, 1e-8, 0.1};
  cfg.momentsDType = momentsDType;
  optim::AdamW onDevice(c1, c1.takeMasters(), cfg);
  std::vector<int64_t> nvmeElems = {0, 0, c2.paddedElems(2)};
  zero::NvmeTier nvme(dir.string(), 0, nvmeElems, momentsDType);
  optim::AdamW tiered(c2, c2.takeMasters(), cfg, {}, {},
                      {zero::Tier::Device, zero::Tier::Host, zero::Tier::Nvme}, &nvme);
  REQUIRE(tiered.home(1) == zero::Tier::Host);
  REQUIRE(tiered.masterFlats()[1].device().isCpu());
  REQUIRE(!tiered.masterFlats()[2].defined());
  for (size_t c : {0, 1}) {
    REQUIRE(tiered.firstMoments()[c].dtype() == momentsDType);
    REQUIRE(tiered.secondMoments()[c].dtype() == momentsDType);
  }
  REQUIRE(nvme.fieldDType(2, zero::NvmeTier::FirstMoment) == momentsDType);
  // The state's bytes: 4 for the master, 2 x 2 or 2 x 4 for m and v.
  uint64_t perElem = 4 + 2 * dtypeSize(momentsDType);
  REQUIRE(tiered.stateBytes(1) == uint64_t(c2.paddedElems(1)) * perElem);
  REQUIRE(tiered.deviceStateBytes(1) == uint64_t(c2.paddedElems(1)) * perElem);
  REQUIRE(nvme.chunkStateBytes(2) == uint64_t(c2.paddedElems(2)) * perElem);
  for (int step = 0; step < 4; ++step) {
    if (step == 2) {
      tiered.moveToDevice(1, Device::cpu());
      tiered.moveToDevice(2, Device::cpu());
      REQUIRE(tiered.home(2) == zero::Tier::Device);
    }
    std::vector<Tensor> g1s, g2s;
    for (size_t c = 0; c < 3; ++c) {
      Tensor g = ops::rand({c1.paddedElems(c)}, gen, DType::F32, Device::cpu(), -1, 1);
      g1s.push_back(g);
      g2s.push_back(g.clone());
    }
    onDevice.stepChunks(0.01, g1s);
    tiered.stepChunks(0.01, g2s);
    INFO("step " << step);
    for (size_t k = 0; k < 3; ++k)
      REQUIRE(ps1[k].second.toVector<double>() == ps2[k].second.toVector<double>());
  }
  for (size_t c = 0; c < 3; ++c) {
    REQUIRE(tiered.firstMoments()[c].dtype() == momentsDType);  // moved with their dtype
    REQUIRE(tiered.firstMoments()[c].toVector<float>() == onDevice.firstMoments()[c].toVector<float>());
    REQUIRE(tiered.secondMoments()[c].toVector<float>() == onDevice.secondMoments()[c].toVector<float>());
    REQUIRE(tiered.masterFlats()[c].toVector<float>() == onDevice.masterFlats()[c].toVector<float>());
  }
}

TEST_CASE("AdamW's SSD read-ahead and write-behind update bit for bit like reading each chunk when it comes",
          "[optim][adamw][chunks][store][nvme]") {
  // Six bf16 chunks, the SSD ones interleaved with a host one and a device one so the read-ahead crosses
  // them: the read-ahead run (two buffer sets) must equal the synchronous one (one set) step by step, for
  // each backend and each stored dtype of m and v, and with fp32 m and v also equal state in host memory.
  fs::path dir = test::freshDir("strata-adamw-readahead");
  auto make = [](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> ps;
    for (int k = 0; k < 6; ++k) {
      Tensor t = ops::rand({80 + 10 * k, 32}, g, DType::F32, Device::cpu(), -0.5, 0.5);
      t.setRequiresGrad(true);
      ps.emplace_back("p" + std::to_string(k), t);
    }
    return ps;
  };
  using zero::Tier;
  std::vector<Tier> homes = {Tier::Nvme, Tier::Host, Tier::Nvme, Tier::Device, Tier::Nvme, Tier::Nvme};
  std::vector<zero::NvmeBackend> backends = {zero::NvmeBackend::Threads};
  if (zero::NvmeTier::uringBuilt()) backends.push_back(zero::NvmeBackend::Uring);
  optim::AdamWConfig cfg{0.01, 0.9, 0.95, 1e-8, 0.1};
  for (zero::NvmeBackend backend : backends) {
    for (DType stateDType : {DType::F32, DType::BF16}) {
      INFO((backend == zero::NvmeBackend::Uring ? "io_uring " : "threads ") << dtypeName(stateDType));
      Generator g0(11), g1(11), g2(11), gen(3);
      auto ps0 = make(g0), ps1 = make(g1), ps2 = make(g2);
      int64_t chunkBytes = 130 * 32 * 2;  // one parameter per chunk: any two are larger
      zero::ChunkManager c0(ps0, chunkBytes, DType::BF16), c1(ps1, chunkBytes, DType::BF16),
          c2(ps2, chunkBytes, DType::BF16);
      REQUIRE(c1.numChunks() == 6);
      std::vector<int64_t> elems;
      for (size_t c = 0; c < 6; ++c) elems.push_back(homes[c] == Tier::Nvme ? c1.paddedElems(c) : 0);
      // Small blocks: each chunk's fields are several pieces.
      zero::NvmeIoConfig io{8192, 3, backend};
      zero::NvmeTier nvme1(dir.string(), 1, elems, stateDType, io),
          nvme2(dir.string(), 2, elems, stateDType, io);
      std::vector<Tier> inMemory = homes;
      for (Tier& t : inMemory)
        if (t == Tier::Nvme) t = Tier::Host;
      optim::AdamW memory(c0, c0.takeMasters(), cfg, {}, {}, inMemory);
      optim::AdamW ahead(c1, c1.takeMasters(), cfg, {}, {}, homes, &nvme1);
      optim::AdamW oneByOne(c2, c2.takeMasters(), cfg, {}, {}, homes, &nvme2);
      oneByOne.setSsdReadAhead(false);
      for (int step = 0; step < 4; ++step) {
        std::vector<Tensor> g0s, g1s, g2s;
        for (size_t c = 0; c < 6; ++c) {
          Tensor g = ops::rand({c1.paddedElems(c)}, gen, DType::F32, Device::cpu(), -1, 1);
          g0s.push_back(g);
          g1s.push_back(g.clone());
          g2s.push_back(g.clone());
        }
        memory.stepChunks(0.01, g0s);
        ahead.stepChunks(0.01, g1s);
        oneByOne.stepChunks(0.01, g2s);
        INFO("step " << step);
        for (size_t k = 0; k < 6; ++k) {
          std::vector<double> a = ps1[k].second.toVector<double>();
          REQUIRE(a == ps2[k].second.toVector<double>());
          // fp32 m and v on the SSD are the state in memory exactly; bf16 ones depart from it.
          if (stateDType == DType::F32) REQUIRE(a == ps0[k].second.toVector<double>());
        }
      }
      // The state on the SSD after the last write-behind: the same bytes from both.
      for (size_t c = 0; c < 6; ++c) {
        if (homes[c] != Tier::Nvme) continue;
        for (auto f : {zero::NvmeTier::Master, zero::NvmeTier::FirstMoment, zero::NvmeTier::SecondMoment}) {
          std::vector<float> a(size_t(elems[c])), b(size_t(elems[c]));
          nvme1.read(c, f, a.data());
          nvme2.read(c, f, b.data());
          REQUIRE(a == b);
          if (stateDType == DType::F32 && f == zero::NvmeTier::FirstMoment)
            REQUIRE(a == memory.firstMoments()[c].toVector<float>());
        }
      }
      REQUIRE(nvme1.bytesRead() > 0);
    }
  }
}

TEST_CASE("an SSD read that fails inside AdamW's step stops it, naming the file",
          "[optim][adamw][store][nvme]") {
  fs::path dir = test::freshDir("strata-adamw-ssd-error");
  std::vector<zero::NvmeBackend> backends = {zero::NvmeBackend::Threads};
  if (zero::NvmeTier::uringBuilt()) backends.push_back(zero::NvmeBackend::Uring);
  for (zero::NvmeBackend backend : backends) {
    Generator g(2);
    std::vector<std::pair<std::string, Tensor>> ps;
    for (const char* name : {"a", "b", "c"}) {
      Tensor t = ops::rand({64, 32}, g, DType::F32, Device::cpu(), -0.5, 0.5);
      t.setRequiresGrad(true);
      ps.emplace_back(name, t);
    }
    zero::ChunkManager chunks(ps, 64 * 32 * 2, DType::BF16);
    std::vector<int64_t> elems;
    for (size_t c = 0; c < chunks.numChunks(); ++c) elems.push_back(chunks.paddedElems(c));
    zero::NvmeTier nvme(dir.string(), 0, elems, DType::F32, zero::NvmeIoConfig{4096, 2, backend});
    optim::AdamW opt(chunks, chunks.takeMasters(), {0.01, 0.9, 0.95, 1e-8, 0.1}, {}, {},
                     std::vector<zero::Tier>(chunks.numChunks(), zero::Tier::Nvme), &nvme);
    std::vector<Tensor> grads;
    for (size_t c = 0; c < chunks.numChunks(); ++c)
      grads.push_back(ops::rand({chunks.paddedElems(c)}, g, DType::F32, Device::cpu(), -1, 1));
    opt.stepChunks(0.01, grads);
    // The file cut short under the optimizer: the next step's first read meets its end.
    fs::resize_file(nvme.path(), 4096);
    std::string e = test::errorOf([&] { opt.stepChunks(0.01, grads); });
    INFO(nvme.backendName() << ": " << e);
    REQUIRE(e.find("the SSD tier's read of") != std::string::npos);
    REQUIRE(e.find(nvme.path()) != std::string::npos);
  }
}

TEST_CASE("a host-tier chunk's update writes its parameters and zeros between them",
          "[optim][adamw][chunks][store]") {
  // Odd-sized parameters in one chunk: each starts 256-byte aligned, so gaps lie between them. The host tier
  // writes the whole range back from its staging buffer: the kernel fills the parameters and the gaps are
  // zeroed apart (the staging memory is reused, so nothing else would clear them). The parameters must match
  // the device tier's bit for bit.
  auto make = [](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> ps;
    for (auto [name, shape] : {std::pair<const char*, Shape>{"a", {7, 3}}, {"b", {5}}, {"c", {11}}}) {
      Tensor t = ops::rand(shape, g, DType::F32, Device::cpu(), -0.5, 0.5);
      t.setRequiresGrad(true);
      ps.emplace_back(name, t);
    }
    return ps;
  };
  Generator g1(4), g2(4), gen(6);
  auto ps1 = make(g1), ps2 = make(g2);
  zero::ChunkManager c1(ps1, 1 << 20, DType::BF16), c2(ps2, 1 << 20, DType::BF16);
  REQUIRE(c1.numChunks() == 1);
  const zero::ChunkLayout& layout = c2.layout();
  std::vector<bool> inParameter(size_t(c2.paddedElems(0)), false);
  for (int64_t j : layout.chunks[0].slots)
    for (int64_t k = 0; k < layout.slots[size_t(j)].numel; ++k)
      inParameter[size_t(layout.slots[size_t(j)].offset + k)] = true;
  REQUIRE(layout.chunks[0].used > 21 + 5 + 11);  // there are gaps
  optim::AdamWConfig cfg{0.01, 0.9, 0.95, 1e-8, 0.1};
  optim::AdamW onDevice(c1, c1.takeMasters(), cfg);
  optim::AdamW onHost(c2, c2.takeMasters(), cfg, {}, {}, {zero::Tier::Host}, nullptr);
  REQUIRE(onHost.home(0) == zero::Tier::Host);
  for (int step = 0; step < 3; ++step) {
    Tensor g = ops::rand({c1.paddedElems(0)}, gen, DType::F32, Device::cpu(), -1, 1);
    onDevice.stepChunks(0.01, {g});
    onHost.stepChunks(0.01, {g.clone()});
    INFO("step " << step);
    for (size_t k = 0; k < ps1.size(); ++k)
      REQUIRE(ps2[k].second.toVector<double>() == ps1[k].second.toVector<double>());
    auto chunk = c2.paddedFlat(0).toVector<double>();
    for (size_t i = 0; i < chunk.size(); ++i)
      if (!inParameter[i]) REQUIRE(chunk[i] == 0.0);
  }
}

TEST_CASE("[cuda] the pipelined update of host and SSD state gives the sequential update's bits",
          "[cuda][optim][adamw][chunks][store][pipeline]") {
  // NOTE [Pipelined update]: the CPU lane and the GPU lane split the host pieces between them; whatever the
  // split, every parameter, master and moment must equal the one-chunk-at-a-time CPU update's, step by step,
  // and the 16-bit chunks keep zeros between their parameters. With fp32 gradients, and with bf16 ones
  // (precision.grad_accum_dtype), which cross to the CPU lane at 2 bytes each; with fp32 m and v, and with
  // bf16 ones (optimizer.moments_dtype), which cross the GPU lane at 2 bytes each and the SSD as they are.
  STRATA_REQUIRE_CUDA();
  DType gradDType = GENERATE(DType::F32, DType::BF16);
  DType momentsDType = GENERATE(DType::F32, DType::BF16);
  INFO("gradients " << dtypeName(gradDType) << ", moments " << dtypeName(momentsDType));
  Device gpu = Device::cuda(0);
  fs::path dir = test::freshDir(std::string("strata-adamw-pipeline-") + dtypeName(gradDType) + "-" +
                                dtypeName(momentsDType));
  auto make = [&](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> ps;
    for (int k = 0; k < 8; ++k) {
      Tensor t =
          ops::to(ops::rand({70 + 10 * k, 33}, g, DType::F32, Device::cpu(), -0.5, 0.5), gpu, DType::F32);
      t.setRequiresGrad(true);
      ps.emplace_back("p" + std::to_string(k), t);
    }
    return ps;
  };
  using zero::Tier;
  std::vector<Tier> homes = {Tier::Host, Tier::Nvme, Tier::Host, Tier::Device,
                             Tier::Host, Tier::Host, Tier::Nvme, Tier::Host};
  Generator g1(21), g2(21), gen(5);
  auto ps1 = make(g1), ps2 = make(g2);
  int64_t chunkBytes = 4700 * 2;  // one parameter per chunk: any two are larger
  zero::ChunkManager c1(ps1, chunkBytes, DType::BF16), c2(ps2, chunkBytes, DType::BF16);
  size_t n = c1.numChunks();
  REQUIRE(n == homes.size());
  std::vector<int64_t> elems;
  for (size_t c = 0; c < n; ++c) elems.push_back(homes[c] == Tier::Nvme ? c1.paddedElems(c) : 0);
  zero::NvmeTier nvme1(dir.string(), 1, elems, momentsDType), nvme2(dir.string(), 2, elems, momentsDType);
  optim::AdamWConfig pipelined{0.01, 0.9, 0.95, 1e-8, 0.1, true, true, 700};  // several pieces per chunk
  pipelined.momentsDType = momentsDType;
  optim::AdamWConfig sequential = pipelined;
  sequential.pipeline = false;
  optim::AdamW a(c1, c1.takeMasters(), pipelined, {}, {}, homes, &nvme1);
  optim::AdamW b(c2, c2.takeMasters(), sequential, {}, {}, homes, &nvme2);
  Tensor scale = ops::full({}, 0.7, DType::F32, gpu);
  double share = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<Tensor> ga, gb;
    for (size_t c = 0; c < n; ++c) {
      Tensor g =
          ops::to(ops::rand({c1.paddedElems(c)}, gen, DType::F32, Device::cpu(), -1, 1), gpu, gradDType);
      ga.push_back(g);
      gb.push_back(g.clone());
    }
    a.stepChunks(0.01, ga, step == 1 ? Tensor() : scale);
    b.stepChunks(0.01, gb, step == 1 ? Tensor() : scale);
    share = std::max(share, a.offloadPhases().gpuLaneShare);
    INFO("step " << step);
    for (size_t c = 0; c < n; ++c) {
      INFO("chunk " << c);
      REQUIRE(c1.paddedFlat(c).toVector<double>() == c2.paddedFlat(c).toVector<double>());
      if (homes[c] == Tier::Nvme) continue;
      REQUIRE(a.firstMoments()[c].dtype() == momentsDType);
      REQUIRE(a.masterFlats()[c].toVector<double>() == b.masterFlats()[c].toVector<double>());
      REQUIRE(a.firstMoments()[c].toVector<double>() == b.firstMoments()[c].toVector<double>());
      REQUIRE(a.secondMoments()[c].toVector<double>() == b.secondMoments()[c].toVector<double>());
    }
  }
  for (size_t c = 0; c < n; ++c) {
    if (homes[c] != Tier::Nvme) continue;
    for (auto f : {zero::NvmeTier::Master, zero::NvmeTier::FirstMoment, zero::NvmeTier::SecondMoment}) {
      std::vector<float> x(size_t(elems[c])), y(size_t(elems[c]));
      nvme1.read(c, f, x.data());
      nvme2.read(c, f, y.data());
      REQUIRE(x == y);
    }
  }
  // The chunks hold zeros between their parameters (the CPU lane sends whole pieces).
  const zero::ChunkLayout& layout = c1.layout();
  for (size_t c = 0; c < n; ++c) {
    std::vector<bool> inParameter(size_t(c1.paddedElems(c)), false);
    for (int64_t j : layout.chunks[c].slots)
      for (int64_t k = 0; k < layout.slots[size_t(j)].numel; ++k)
        inParameter[size_t(layout.slots[size_t(j)].offset + k)] = true;
    auto chunk = c1.paddedFlat(c).toVector<double>();
    for (size_t i = 0; i < chunk.size(); ++i)
      if (!inParameter[i]) REQUIRE(chunk[i] == 0.0);
  }
  INFO("the GPU lane's largest share of a step: " << share);
  REQUIRE(share > 0);
}

TEST_CASE("the delayed SSD update lands each step's update one step late, and equals the undelayed one after",
          "[optim][adamw][chunks][store][nvme][delayed]") {
  // NOTE [Delayed SSD update]: the reference is the plain optimizer with the same chunks in host memory, fed
  // the same gradients. After step t the delayed one's SSD chunks hold the reference's parameters of step
  // t - 1 and every other chunk those of step t; once finished, all parameters and the SSD's state are the
  // reference's. With m and v in fp32, and in bf16 (optimizer.moments_dtype; on the SSD as they are).
  DType momentsDType = GENERATE(DType::F32, DType::BF16);
  INFO("moments " << dtypeName(momentsDType));
  fs::path dir = test::freshDir("strata-adamw-delayed");
  auto make = [](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> ps;
    for (int k = 0; k < 5; ++k) {
      Tensor t = ops::rand({60 + 10 * k, 16}, g, DType::F32, Device::cpu(), -0.5, 0.5);
      t.setRequiresGrad(true);
      ps.emplace_back("p" + std::to_string(k), t);
    }
    return ps;
  };
  using zero::Tier;
  std::vector<Tier> homes = {Tier::Host, Tier::Nvme, Tier::Device, Tier::Nvme, Tier::Host};
  std::vector<Tier> inMemory = {Tier::Host, Tier::Host, Tier::Device, Tier::Host, Tier::Host};
  Generator g1(31), g2(31), gen(8);
  auto ps1 = make(g1), ps2 = make(g2);
  int64_t chunkBytes = 100 * 16 * 2;  // one parameter per chunk
  zero::ChunkManager c1(ps1, chunkBytes, DType::BF16), c2(ps2, chunkBytes, DType::BF16);
  size_t n = c1.numChunks();
  REQUIRE(n == homes.size());
  std::vector<int64_t> elems;
  for (size_t c = 0; c < n; ++c) elems.push_back(homes[c] == Tier::Nvme ? c1.paddedElems(c) : 0);
  zero::NvmeTier nvme(dir.string(), 1, elems, momentsDType);
  optim::AdamWConfig cfg{0.01, 0.9, 0.95, 1e-8, 0.1};
  cfg.momentsDType = momentsDType;
  optim::AdamWConfig delayedCfg = cfg;
  delayedCfg.delayedSsdUpdate = true;
  optim::AdamW delayed(c1, c1.takeMasters(), delayedCfg, {}, {}, homes, &nvme);
  optim::AdamW reference(c2, c2.takeMasters(), cfg, {}, {}, inMemory);
  std::vector<std::vector<double>> before(n);  // the reference's parameters before the step
  for (int step = 0; step < 5; ++step) {
    for (size_t c = 0; c < n; ++c) before[c] = c2.paddedFlat(c).toVector<double>();
    std::vector<Tensor> ga, gb;
    for (size_t c = 0; c < n; ++c) {
      Tensor g = ops::rand({c1.paddedElems(c)}, gen, DType::F32, Device::cpu(), -1, 1);
      ga.push_back(g);
      gb.push_back(g.clone());
    }
    Tensor scale = step % 2 ? ops::full({}, 0.6, DType::F32, Device::cpu()) : Tensor();
    delayed.stepChunks(0.01, ga, scale);
    reference.stepChunks(0.01, gb, scale);
    INFO("step " << step);
    for (size_t c = 0; c < n; ++c) {
      INFO("chunk " << c);
      std::vector<double> now = c1.paddedFlat(c).toVector<double>();
      if (homes[c] == Tier::Nvme)
        REQUIRE(now == before[c]);  // the SSD chunk still holds the last step's parameters
      else
        REQUIRE(now == c2.paddedFlat(c).toVector<double>());
    }
  }
  delayed.finishDelayed();
  for (size_t c = 0; c < n; ++c) {
    INFO("chunk " << c);
    REQUIRE(c1.paddedFlat(c).toVector<double>() == c2.paddedFlat(c).toVector<double>());
    if (homes[c] != Tier::Nvme) continue;
    std::vector<float> master(size_t(elems[c])), m(size_t(elems[c])), v(size_t(elems[c]));
    nvme.read(c, zero::NvmeTier::Master, master.data());
    nvme.read(c, zero::NvmeTier::FirstMoment, m.data());
    nvme.read(c, zero::NvmeTier::SecondMoment, v.data());
    REQUIRE(master == reference.masterFlats()[c].toVector<float>());
    REQUIRE(m == reference.firstMoments()[c].toVector<float>());
    REQUIRE(v == reference.secondMoments()[c].toVector<float>());
  }
}

TEST_CASE(
    "with a delayed SSD update pending, a checkpoint's reads change nothing, and moving a chunk to the "
    "device is the run that had it there from the start",
    "[optim][adamw][chunks][store][nvme][delayed]") {
  // NOTE [Delayed SSD update]: after the first step, with its update of the SSD chunks 1 and 3 pending, `a`
  // is read as a checkpoint reads it and then moves chunk 1's state to the device (the memory tracer's
  // promotion). `b` had chunk 1 on the device from the start. Chunk 3 keeps its stale parameters until the
  // next update in both; chunk 1 takes its new ones at once.
  fs::path dir = test::freshDir("strata-adamw-delayed-move");
  auto make = [](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> ps;
    for (int k = 0; k < 5; ++k) {
      Tensor t = ops::rand({60 + 10 * k, 16}, g, DType::F32, Device::cpu(), -0.5, 0.5);
      t.setRequiresGrad(true);
      ps.emplace_back("p" + std::to_string(k), t);
    }
    return ps;
  };
  using zero::Tier;
  std::vector<Tier> homesA = {Tier::Host, Tier::Nvme, Tier::Device, Tier::Nvme, Tier::Host};
  std::vector<Tier> homesB = {Tier::Host, Tier::Device, Tier::Device, Tier::Nvme, Tier::Host};
  Generator g1(41), g2(41), gen(9);
  auto ps1 = make(g1), ps2 = make(g2);
  int64_t chunkBytes = 100 * 16 * 2;  // one parameter per chunk
  zero::ChunkManager c1(ps1, chunkBytes, DType::BF16), c2(ps2, chunkBytes, DType::BF16);
  size_t n = c1.numChunks();
  REQUIRE(n == homesA.size());
  std::vector<int64_t> elemsA, elemsB;
  for (size_t c = 0; c < n; ++c) {
    elemsA.push_back(homesA[c] == Tier::Nvme ? c1.paddedElems(c) : 0);
    elemsB.push_back(homesB[c] == Tier::Nvme ? c2.paddedElems(c) : 0);
  }
  zero::NvmeTier nvmeA(dir.string(), 1, elemsA, DType::F32), nvmeB(dir.string(), 2, elemsB, DType::F32);
  optim::AdamWConfig cfg{0.01, 0.9, 0.95, 1e-8, 0.1};
  cfg.delayedSsdUpdate = true;
  optim::AdamW a(c1, c1.takeMasters(), cfg, {}, {}, homesA, &nvmeA);
  optim::AdamW b(c2, c2.takeMasters(), cfg, {}, {}, homesB, &nvmeB);
  auto chunkValues = [&](zero::ChunkManager& cm) {
    std::vector<std::vector<double>> out;
    for (size_t c = 0; c < n; ++c) out.push_back(cm.paddedFlat(c).toVector<double>());
    return out;
  };
  for (int step = 0; step < 5; ++step) {
    std::vector<Tensor> ga, gb;
    for (size_t c = 0; c < n; ++c) {
      Tensor g = ops::rand({c1.paddedElems(c)}, gen, DType::F32, Device::cpu(), -1, 1);
      ga.push_back(g);
      gb.push_back(g.clone());
    }
    Tensor scale = step % 2 ? ops::full({}, 0.6, DType::F32, Device::cpu()) : Tensor();
    a.stepChunks(0.01, ga, scale);
    b.stepChunks(0.01, gb, scale);
    INFO("step " << step);
    if (step == 0) {
      auto before = chunkValues(c1);
      // What a checkpoint reads: the worker waited for, the pending parameters, the SSD's state.
      a.waitDelayed();
      REQUIRE(!a.pendingParameters(0).defined());  // host memory: updated in the step
      Tensor pending3 = a.pendingParameters(3);
      REQUIRE(pending3.defined());
      REQUIRE(pending3.toVector<double>() == b.pendingParameters(3).toVector<double>());
      REQUIRE(pending3.toVector<double>() != before[3]);
      // The SSD holds the finished state, whose master rounds to the pending parameters.
      std::vector<float> master(static_cast<size_t>(elemsA[3])), masterB(static_cast<size_t>(elemsB[3]));
      nvmeA.read(3, zero::NvmeTier::Master, master.data());
      nvmeB.read(3, zero::NvmeTier::Master, masterB.data());
      REQUIRE(master == masterB);
      Tensor rounded = Tensor::fromVector(master, {elemsA[3]}).to(DType::BF16);
      REQUIRE(rounded.toVector<double>() == pending3.toVector<double>());
      REQUIRE(chunkValues(c1) == before);
      a.moveToDevice(1, Device::cpu());
      REQUIRE(a.home(1) == Tier::Device);
      REQUIRE(!a.pendingParameters(1).defined());
      REQUIRE(a.pendingParameters(3).defined());
      auto after = chunkValues(c1);
      REQUIRE(after[3] == before[3]);  // still on the SSD: stale until the next update
      REQUIRE(after[1] != before[1]);
    }
    auto va = chunkValues(c1), vb = chunkValues(c2);
    for (size_t c = 0; c < n; ++c) {
      INFO("chunk " << c);
      REQUIRE(va[c] == vb[c]);
    }
  }
  a.finishDelayed();
  b.finishDelayed();
  REQUIRE(chunkValues(c1) == chunkValues(c2));
  REQUIRE(a.masterFlats()[1].toVector<float>() == b.masterFlats()[1].toVector<float>());
  REQUIRE(a.firstMoments()[1].toVector<float>() == b.firstMoments()[1].toVector<float>());
  REQUIRE(a.secondMoments()[1].toVector<float>() == b.secondMoments()[1].toVector<float>());
  std::vector<float> x(static_cast<size_t>(elemsA[3])), y(static_cast<size_t>(elemsB[3]));
  nvmeA.read(3, zero::NvmeTier::SecondMoment, x.data());
  nvmeB.read(3, zero::NvmeTier::SecondMoment, y.data());
  REQUIRE(x == y);
}
