#include "models/HfLayout.h"

#include <algorithm>
#include <set>

#include "strata/ops/Ops.h"

namespace strata::models {
namespace {

std::map<std::string, Tensor> parametersByName(const nn::Module& model) {
  std::map<std::string, Tensor> out;
  for (auto& [name, p] : model.namedParameters()) out.emplace(name, p);
  return out;
}

// The part of `param` that `t` names, as a raw view (no autograd) in HF's orientation.
Tensor hfView(const Tensor& param, const HfTensor& t) {
  Tensor v = param.detach();
  STRATA_CHECK(v.dim() == 1 || v.dim() == 2, "HF layout: parameter '{}' is {}-D", t.param, v.dim());
  int64_t full = v.size(v.dim() - 1);
  int64_t length = t.length > 0 ? t.length : full - t.offset;
  STRATA_CHECK(t.offset >= 0 && t.offset + length <= full,
               "HF layout: '{}' takes [{}, {}) of '{}', which has {} along its last dimension", t.hfName,
               t.offset, t.offset + length, t.param, full);
  v = v.narrow(v.dim() - 1, t.offset, length);
  if (t.transpose) {
    STRATA_CHECK(v.dim() == 2, "HF layout: '{}' transposes 1-D '{}'", t.hfName, t.param);
    v = v.transpose(0, 1);
  }
  return v;
}

const Tensor& find(const std::map<std::string, Tensor>& params, const HfTensor& t) {
  auto it = params.find(t.param);
  STRATA_CHECK(it != params.end(), "HF layout: '{}' maps to '{}', which the model does not have", t.hfName,
               t.param);
  return it->second;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> exportHf(const nn::Module& model, const HfLayout& layout) {
  return exportHf(parametersByName(model), layout);
}

std::vector<std::pair<std::string, Tensor>> exportHf(const std::map<std::string, Tensor>& params,
                                                     const HfLayout& layout) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const HfTensor& t : layout)
    out.emplace_back(t.hfName, ops::contiguous(hfView(find(params, t), t).to(Device::cpu(), DType::F32)));
  return out;
}

void importHf(nn::Module& model, const HfLayout& layout, const std::map<std::string, Tensor>& hf,
              std::vector<std::string>* unused) {
  auto params = parametersByName(model);
  std::set<std::string> used;
  for (const HfTensor& t : layout) {
    auto it = hf.find(t.hfName);
    STRATA_USER_CHECK(it != hf.end(), "HF checkpoint has no '{}' (for parameter '{}')", t.hfName, t.param);
    Tensor dst = hfView(find(params, t), t);
    STRATA_USER_CHECK(it->second.shape() == dst.shape(), "HF tensor '{}' is {}, expected {} (for '{}')",
                      t.hfName, toString(it->second.shape()), toString(dst.shape()), t.param);
    ops::copy(dst, it->second);
    used.insert(t.hfName);
  }
  if (unused)
    for (auto& [name, _] : hf)
      if (!used.count(name)) unused->push_back(name);
}

void checkHfLayoutCovers(const nn::Module& model, const HfLayout& layout) {
  auto params = parametersByName(model);
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges;  // [begin, end) of the last dim
  std::set<std::string> hfNames;
  for (const HfTensor& t : layout) {
    STRATA_CHECK(hfNames.insert(t.hfName).second, "HF layout names '{}' twice", t.hfName);
    const Tensor& p = find(params, t);
    int64_t full = p.size(p.dim() - 1);
    ranges[t.param].emplace_back(t.offset, t.length > 0 ? t.offset + t.length : full);
  }
  for (auto& [name, p] : params) {
    auto& r = ranges[name];
    std::sort(r.begin(), r.end());
    int64_t end = 0;
    for (auto [b, e] : r) {
      STRATA_CHECK(b == end, "HF layout: parameter '{}' has a gap or an overlap at column {}", name, end);
      end = e;
    }
    STRATA_CHECK(end == p.size(p.dim() - 1), "HF layout: parameter '{}' is covered up to column {} of {}",
                 name, end, p.size(p.dim() - 1));
  }
}

}  // namespace strata::models
