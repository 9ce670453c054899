// How a zoo model's parameters map onto an HF transformers checkpoint, for the architectures whose tensors do
// not map one to one (BERT and T5: HF keeps q, k and v apart and stores nn.Linear weights as [out, in], while
// Strata packs qkv into one [in, 3 * out] weight). Each HF tensor is a column range of one Strata parameter,
// transposed or not; export and import walk the same list, so they are inverse by construction.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strata/nn/Module.h"

namespace strata::models {

struct HfTensor {
  std::string hfName;
  std::string param;  // the Strata parameter's dotted name
  // For a 2-D [in, out] weight: columns [offset, offset + length) (the out features of a packed projection);
  // for a 1-D bias: elements. length 0 means the whole parameter.
  int64_t offset = 0, length = 0;
  bool transpose = false;  // HF's nn.Linear stores [out, in]
};
using HfLayout = std::vector<HfTensor>;

// The HF tensors of `model` (fp32, contiguous, on the CPU) in layout order.
std::vector<std::pair<std::string, Tensor>> exportHf(const nn::Module& model, const HfLayout& layout);
// The same cut of any tensors shaped as the model's parameters, by parameter name: their gradients, say.
std::vector<std::pair<std::string, Tensor>> exportHf(const std::map<std::string, Tensor>& byParameter,
                                                     const HfLayout& layout);
// Copies the HF tensors named by `layout` from `hf` into the model's parameters (converting dtype and
// device). Throws on a missing tensor or a wrong shape, naming it. Tensors of `hf` that the layout does not
// name are ignored (tied copies, HF's buffers); `unused`, if given, receives their names.
void importHf(nn::Module& model, const HfLayout& layout, const std::map<std::string, Tensor>& hf,
              std::vector<std::string>* unused = nullptr);
// Checks that `layout` covers every parameter of `model` exactly once (each element of each parameter in one
// HF tensor): a test and import-time guard against a layout that drifts from the model.
void checkHfLayoutCovers(const nn::Module& model, const HfLayout& layout);

}  // namespace strata::models
