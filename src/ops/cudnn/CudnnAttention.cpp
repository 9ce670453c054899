// cuDNN 9's fused scaled-dot-product attention (the Hopper kernels PyTorch's SDPA calls), forward and
// backward, through the cuDNN frontend's graph API. Built only when the frontend's headers are found
// (STRATA_CUDNN_FRONTEND_DIR); ops::flashAttention takes it unless STRATA_ATTENTION=native (Attention.cpp).
//
// One graph per shape, strides, dtype, scale and mask, built on first use and cached (per device); a shape
// cuDNN does not support is remembered too, and the caller falls back to Strata's own kernel. The statistics
// cuDNN keeps for the backward are the natural-log log-sum-exp of each query row, [B, H, Sq] fp32: they go in
// the result's lse2 slot, marked as cuDNN's, so only cuDNN's backward reads them.
//
// An additive bias (NOTE [Biased fused attention] in kernels/FlashAttention.cuh) goes to cuDNN's bias input
// where the whole batch shares it ([1, H, Sq, Sk], T5's case), and its gradient to cuDNN's dBias, written in
// the operands' dtype and then added into the caller's fp32 accumulator. cuDNN's bottom-right causal mask
// takes no bias: a causal biased case runs here only where Sq == Sk (top-left and bottom-right agree). A
// backward cuDNN refuses returns false and the caller runs Strata's kernels instead (ops/Attention.cpp).
#include <cudnn.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <cudnn_frontend.h>
#include <spdlog/spdlog.h>

#include "core/cuda/CudaContext.h"
#include "src/ops/Kernels.h"
#include "strata/core/Allocator.h"

namespace strata::ops {
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kBias, kDBias };

// [B, S, H, D] views as cuDNN's [B, H, S, D] dims and strides.
std::vector<int64_t> dimsOf(const Tensor& t) {
  return {t.size(0), t.size(2), t.size(1), t.size(3)};
}
std::vector<int64_t> stridesOf(const Tensor& t) {
  return {t.strides()[0], t.strides()[2], t.strides()[1], t.strides()[3]};
}

std::string describe(const Tensor& t) {
  std::string s;
  for (int64_t d : dimsOf(t)) s += std::to_string(d) + ",";
  s += "/";
  for (int64_t d : stridesOf(t)) s += std::to_string(d) + ",";
  return s + ";";
}

cudnnHandle_t handleFor(Device device) {
  static std::mutex mutex;
  static std::unordered_map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device.index);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  cuda::DeviceGuard guard(device.index);  // a handle belongs to the device current at its creation
  cudnnStatus_t status = cudnnCreate(&h);
  STRATA_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN attention: cudnnCreate failed: {}",
               cudnnGetErrorString(status));
  handles.emplace(device.index, h);
  return h;
}

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN does not support this case
  int64_t workspace = 0;
};

std::mutex cacheMutex;
std::unordered_map<std::string, Plan>& cache() {
  static std::unordered_map<std::string, Plan> plans;
  return plans;
}

fe::DataType_t feType(DType t) {
  return t == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// Builds the graph (or finds it); null graph when cuDNN refuses the case.
Plan& planFor(const std::string& key, Device device, const std::function<bool(fe::graph::Graph&)>& define,
              cudnnHandle_t handle) {
  std::lock_guard<std::mutex> lock(cacheMutex);
  auto it = cache().find(key);
  if (it != cache().end()) return it->second;
  Plan plan;
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  bool ok = define(*graph) && graph->validate().is_good() && graph->build_operation_graph(handle).is_good() &&
            graph->create_execution_plans({fe::HeurMode_t::A}).is_good() &&
            graph->check_support(handle).is_good() &&
            graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE).is_good() &&
            graph->get_workspace_size(plan.workspace).is_good();
  if (ok) {
    plan.graph = graph;
    spdlog::debug("cuDNN attention: built {} (workspace {} bytes)", key, plan.workspace);
  } else {
    spdlog::warn("cuDNN attention does not support {} on {}: Strata's own kernel runs it", key,
                 toString(device));
  }
  return cache().emplace(key, std::move(plan)).first->second;
}

void run(const Plan& plan, Device device, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack) {
  cudaStream_t stream = cuda::nativeStream(currentStream(device));
  cudnnStatus_t status = cudnnSetStream(handle, stream);
  STRATA_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN attention: cudnnSetStream failed: {}",
               cudnnGetErrorString(status));
  Tensor workspace = plan.workspace > 0 ? Tensor::empty({plan.workspace}, DType::U8, device) : Tensor();
  auto e = plan.graph->execute(handle, pack, plan.workspace > 0 ? workspace.data() : nullptr);
  STRATA_CHECK(e.is_good(), "cuDNN attention: execute failed: {}", e.get_message());
}

std::string keyOf(const char* what, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const AttentionOptions& options) {
  std::string key = std::string(what) + ":" + std::to_string(q.device().index) + ":" + dtypeName(q.dtype()) +
                    ":" + describe(q) + describe(k) + describe(v) + describe(o);
  uint64_t bits = 0;
  double scale = options.scale;
  std::memcpy(&bits, &scale, sizeof bits);
  key += std::to_string(bits) + (options.causal ? ":causal" : "");
  if (options.bias.defined()) {
    key += ":bias";
    for (int64_t d : options.bias.shape()) key += "," + std::to_string(d);
    for (int64_t st : options.bias.strides()) key += "/" + std::to_string(st);
  }
  return key;
}

// Whether cuDNN's graph can take this bias (see the file's note): shared by the batch, and no causal mask
// whose bottom-right alignment differs from top-left.
bool biasTaken(const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  if (!options.bias.defined()) return true;
  return options.bias.size(0) == 1 && (!options.causal || q.size(1) == k.size(1));
}

// The causal mask: bottom-right (Strata's rule, NOTE above forward) without a bias; top-left with one, where
// biasTaken has made sure Sq == Sk.
template <class Attributes>
void causalMask(Attributes& attributes, const AttentionOptions& options) {
  if (!options.causal) return;
  if (options.bias.defined())
    attributes.set_causal_mask(true);
  else
    attributes.set_causal_mask_bottom_right(true);
}

std::shared_ptr<fe::graph::Tensor_attributes> biasInput(fe::graph::Graph& g, const Tensor& bias) {
  return g.tensor(
      fe::graph::Tensor_attributes()
          .set_name("bias")
          .set_uid(kBias)
          .set_dim({bias.size(0), bias.size(1), bias.size(2), bias.size(3)})
          .set_stride({bias.strides()[0], bias.strides()[1], bias.strides()[2], bias.strides()[3]})
          .set_data_type(feType(bias.dtype())));
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, int64_t uid,
                                                    const Tensor& t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(dimsOf(t))
                      .set_stride(stridesOf(t))
                      .set_data_type(feType(t.dtype())));
}

std::shared_ptr<fe::graph::Tensor_attributes> stats(fe::graph::Graph& g, const Tensor& lse) {
  int64_t B = lse.size(0), H = lse.size(1), S = lse.size(2);
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("stats")
                      .set_uid(kStats)
                      .set_dim({B, H, S, 1})
                      .set_stride({H * S, S, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, const Tensor& like) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim(dimsOf(like))
      .set_stride(stridesOf(like))
      .set_data_type(feType(like.dtype()));
}

// NOTE: Strata's causal mask hides key j from query i when j > i + (Sk - Sq): cuDNN's bottom-right diagonal.
bool forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
             const AttentionOptions& options) {
  if (!biasTaken(q, k, options)) return false;
  Device device = q.device();
  cudnnHandle_t handle = handleFor(device);
  Plan& plan = planFor(
      keyOf("fwd", q, k, v, out, options), device,
      [&](fe::graph::Graph& g) {
        g.set_io_data_type(feType(q.dtype()));
        auto tq = input(g, "q", kQ, q), tk = input(g, "k", kK, k), tv = input(g, "v", kV, v);
        auto attributes =
            fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(
                float(options.scale));
        causalMask(attributes, options);
        if (options.bias.defined()) attributes.set_bias(biasInput(g, options.bias));
        auto [to, ts] = g.sdpa(tq, tk, tv, attributes);
        output(to, kO, out);
        int64_t B = lse.size(0), H = lse.size(1), S = lse.size(2);
        ts->set_output(true)
            .set_uid(kStats)
            .set_dim({B, H, S, 1})
            .set_stride({H * S, S, 1, 1})
            .set_data_type(fe::DataType_t::FLOAT);
        return true;
      },
      handle);
  if (!plan.graph) return false;
  std::unordered_map<int64_t, void*> pack{
      {kQ, q.data()}, {kK, k.data()}, {kV, v.data()}, {kO, out.data()}, {kStats, lse.data()}};
  if (options.bias.defined()) pack.emplace(kBias, options.bias.data());
  run(plan, device, handle, pack);
  return true;
}

bool backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
              const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias,
              const AttentionOptions& options) {
  if (!biasTaken(q, k, options)) return false;
  Device device = q.device();
  cudnnHandle_t handle = handleFor(device);
  std::string key = keyOf("bwd", q, k, v, out, options) + describe(dout) + describe(dq) + describe(dk) +
                    describe(dv) + (dbias.defined() ? ":dbias" : "");
  // cuDNN writes dBias, contiguous in the operands' dtype; the caller's accumulator takes it after.
  Tensor dbiasOwn = dbias.defined() ? Tensor::empty(dbias.shape(), q.dtype(), device) : Tensor();
  Plan& plan = planFor(
      key, device,
      [&](fe::graph::Graph& g) {
        g.set_io_data_type(feType(q.dtype()));
        auto tq = input(g, "q", kQ, q), tk = input(g, "k", kK, k), tv = input(g, "v", kV, v);
        auto to = input(g, "o", kO, out), tdo = input(g, "do", kDO, dout);
        auto ts = stats(g, lse);
        auto attributes = fe::graph::SDPA_backward_attributes()
                              .set_name("sdpa_backward")
                              .set_attn_scale(float(options.scale));
        causalMask(attributes, options);
        if (options.bias.defined()) attributes.set_bias(biasInput(g, options.bias));
        if (dbiasOwn.defined()) {
          int64_t H = dbiasOwn.size(1), Sq = dbiasOwn.size(2), Sk = dbiasOwn.size(3);
          attributes.set_dbias(g.tensor(fe::graph::Tensor_attributes()
                                            .set_name("dbias")
                                            .set_uid(kDBias)
                                            .set_dim({1, H, Sq, Sk})
                                            .set_stride({H * Sq * Sk, Sq * Sk, Sk, 1})
                                            .set_data_type(feType(q.dtype()))));
        }
        auto [tdq, tdk, tdv] = g.sdpa_backward(tq, tk, tv, to, tdo, ts, attributes);
        output(tdq, kDQ, dq);
        output(tdk, kDK, dk);
        output(tdv, kDV, dv);
        return true;
      },
      handle);
  if (plan.graph == nullptr) return false;  // the caller runs Strata's kernels
  std::unordered_map<int64_t, void*> pack{{kQ, q.data()},   {kK, k.data()},     {kV, v.data()},
                                          {kO, out.data()}, {kDO, dout.data()}, {kStats, lse.data()},
                                          {kDQ, dq.data()}, {kDK, dk.data()},   {kDV, dv.data()}};
  if (options.bias.defined()) pack.emplace(kBias, options.bias.data());
  if (dbiasOwn.defined()) pack.emplace(kDBias, dbiasOwn.data());
  run(plan, device, handle, pack);
  if (dbiasOwn.defined()) copy(dbias, dbiasOwn);  // the accumulator is zero on entry
  return true;
}

}  // namespace

void registerCudnnAttention(Registry& r) {
  r.add<CudnnAttentionKernel>("cudnn_attention", DeviceType::CUDA, &forward);
  r.add<CudnnAttentionBackwardKernel>("cudnn_attention_backward", DeviceType::CUDA, &backward);
}

}  // namespace strata::ops
