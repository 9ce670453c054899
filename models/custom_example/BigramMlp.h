// A small next-token model written the way a Strata user writes one: a Module with parameters, implementing
// nn::CausalLM so the stock trainer can train it. Each position sees its own token and the previous one (a
// "bigram" context) through an embedding and a two-layer GELU MLP.
//
// The model implements logitsImpl(); callers use logits() and loss(), which run the module hooks around it
// (ZeRO gathers and releases parameters there). Submodules are used through their entry points (apply), so
// their hooks fire too: under ZeRO-3 a child's parameters are resident only during the child's call, so
// code that reads hidden_->weight itself must run inside hidden_->call(...) (NOTE [Module calls] in
// strata/nn/Module.h).
//
// It names itself for the trainer's log (name()) and counts its training FLOPs per token
// (flopsPerToken()), from which the trainer reports TFLOP/s and MFU; a model that counts none is logged with
// "TFLOP/s unknown".
#pragma once

#include <strata/autograd/Functions.h>
#include <strata/nn/CausalLM.h>
#include <strata/nn/Embedding.h>
#include <strata/nn/Linear.h>

#include <memory>
#include <optional>
#include <string>

namespace example {

class BigramMlp : public strata::nn::CausalLM {
 public:
  BigramMlp(int64_t vocab, int64_t dim, int64_t context, strata::Device device, uint64_t seed = 7)
      : vocab_(vocab), context_(context) {
    strata::Generator gen(seed);
    embed_ = registerModule("embed", std::make_shared<strata::nn::Embedding>(
                                         strata::nn::EmbeddingConfig{vocab, dim, 0.02, device}, gen));
    // A Linear's weight is [in, out] (hidden.weight [2 dim, 4 dim], out.weight [4 dim, vocab]): the
    // transpose of PyTorch's nn.Linear [out, in]. Weights brought from PyTorch go in transposed (see
    // strata/nn/Linear.h).
    hidden_ =
        registerModule("hidden", std::make_shared<strata::nn::Linear>(
                                     strata::nn::LinearConfig{2 * dim, 4 * dim, true, 0.02, device}, gen));
    out_ = registerModule("out", std::make_shared<strata::nn::Linear>(
                                     strata::nn::LinearConfig{4 * dim, vocab, true, 0.02, device}, gen));
  }

  int64_t contextLength() const override { return context_; }
  int64_t vocabSize() const override { return vocab_; }
  std::string name() const override { return "bigram-mlp"; }
  // The two GEMMs per token: x W with W [in, out] costs 2 x in x out FLOPs forward and twice that backward
  // (the gradients of x and of W), so 6 x the weights' elements. The embedding is a lookup, and the biases,
  // the GELU and the loss are elementwise: none of them counts.
  std::optional<double> flopsPerToken() const override {
    return 6.0 * double(hidden_->weight.numel() + out_->weight.numel());
  }

 protected:
  strata::Tensor logitsImpl(const strata::Tensor& ids, strata::DType compute) override {
    using namespace strata;
    Tensor e = embed_->apply(ids, compute);  // [B, T, D]
    int64_t T = ids.size(1);
    // The previous token's embedding (zeros before the first token).
    Tensor prev = cat({zeros({e.size(0), 1, e.size(2)}, e.dtype(), e.device()), e.narrow(1, 0, T - 1)}, 1);
    Tensor h = gelu(hidden_->apply(cat({prev, e}, 2)));
    return out_->apply(h);
  }

 private:
  int64_t vocab_, context_;
  std::shared_ptr<strata::nn::Embedding> embed_;
  std::shared_ptr<strata::nn::Linear> hidden_, out_;
};

}  // namespace example
