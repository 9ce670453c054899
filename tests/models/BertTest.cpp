#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "models/ZooHf.h"
#include "models/bert/Bert.h"
#include "models/bert/BertHf.h"
#include "models/gpt/Gpt.h"

using namespace strata;

namespace {
models::BertConfig tiny(bool nsp = false) {
  models::BertConfig c;
  c.numLayers = 2;
  c.hiddenSize = 32;
  c.numHeads = 4;
  c.seqLength = 16;
  c.vocabSize = 50;
  c.dropout = 0.0;
  c.nspHead = nsp;
  return c;
}

models::ModelSpec tinySpec() {
  models::ModelSpec s;
  s.arch = "bert";
  s.numLayers = 2;
  s.hiddenSize = 32;
  s.numHeads = 4;
  s.seqLength = 16;
  s.vocabSize = 50;
  s.bertBinaryHead = true;
  return s;
}
}  // namespace

TEST_CASE("BERT's parameters: names, shapes and first-use order match the spec's list", "[models][bert]") {
  models::ModelSpec spec = tinySpec();
  auto model = models::buildModule(spec);
  auto named = model->namedParameters();
  auto shapes = models::parameterShapes(spec);
  REQUIRE(named.size() == shapes.size());
  for (size_t i = 0; i < named.size(); ++i) {
    INFO(named[i].first);
    REQUIRE(named[i].first == shapes[i].first);
    REQUIRE(named[i].second.shape() == shapes[i].second);
  }
  REQUIRE(model->numParameters() == models::numParameters(spec));
  REQUIRE(named.front().first == "embeddings.word.weight");
  REQUIRE(named.back().first == "nsp.bias");
  // Its own FLOPs formula: above 6 N of the non-embedding layers, and not GPT's (no word table lookup cost).
  REQUIRE(models::flopsPerToken(spec) != models::gptConfig(spec).flopsPerToken());
  REQUIRE(models::objective("bert") == models::Objective::MaskedLM);
  REQUIRE(test::errorOf([&] { models::buildModel(spec); }).find("masked-LM") != std::string::npos);
}

TEST_CASE("BERT padding: padded keys change nothing at the real positions", "[models][bert]") {
  models::Bert bert(tiny());
  bert.eval();
  Tensor ids = Tensor::fromVector<int64_t>({5, 6, 7, 0, 0}, {1, 5});
  Tensor other = Tensor::fromVector<int64_t>({5, 6, 7, 30, 31}, {1, 5});
  Tensor mask = Tensor::fromVector<int64_t>({1, 1, 1, 0, 0}, {1, 5});
  Tensor types = Tensor::fromVector<int64_t>({0, 0, 1, 1, 1}, {1, 5});
  Tensor a = bert.encode(ids, types, mask, DType::F32).narrow(1, 0, 3);
  Tensor b = bert.encode(other, types, mask, DType::F32).narrow(1, 0, 3);
  test::requireClose(a, b, 1e-6, 1e-5);
  // The same as the unpadded sequence alone.
  Tensor alone = bert.encode(ids.narrow(1, 0, 3), types.narrow(1, 0, 3), Tensor(), DType::F32);
  test::requireClose(a, alone, 1e-6, 1e-5);
  // Without the mask the padding is attended to.
  Tensor unmasked = bert.encode(other, types, Tensor(), DType::F32).narrow(1, 0, 3);
  REQUIRE(test::closeness(unmasked.contiguous().toVector<double>(), a.contiguous().toVector<double>(), 1e-6,
                          1e-5) > 1.0);
  // Token types matter.
  Tensor zeroTypes = bert.encode(ids, Tensor(), mask, DType::F32).narrow(1, 0, 3);
  REQUIRE(test::closeness(zeroTypes.contiguous().toVector<double>(), a.contiguous().toVector<double>(), 1e-6,
                          1e-5) > 1.0);
}

TEST_CASE("BERT MLM loss is the cross-entropy of the MLM logits at the labelled positions",
          "[models][bert]") {
  models::Bert bert(tiny(true));
  Tensor ids = Tensor::fromVector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  Tensor mask = Tensor::fromVector<int64_t>({1, 1, 1, 1, 1, 1, 1, 0}, {2, 4});
  Tensor labels = Tensor::fromVector<int64_t>({-100, 9, -100, -100, 11, -100, 12, -100}, {2, 4});
  Tensor logits = bert.mlmLogits(ids, Tensor(), mask, DType::F32);
  REQUIRE(logits.shape() == Shape({2, 4, 50}));
  // Hand-computed mean of -log softmax at (0,1)->9, (1,0)->11, (1,2)->12.
  std::vector<float> l = logits.contiguous().toVector<float>();
  double expected = 0;
  for (auto [row, label] : std::vector<std::pair<int, int>>{{1, 9}, {4, 11}, {6, 12}}) {
    double mx = -1e30, z = 0;
    for (int v = 0; v < 50; ++v) mx = std::max(mx, double(l[size_t(row * 50 + v)]));
    for (int v = 0; v < 50; ++v) z += std::exp(double(l[size_t(row * 50 + v)]) - mx);
    expected += (std::log(z) + mx - double(l[size_t(row * 50 + label)])) / 3.0;
  }
  Tensor loss = bert.mlmLoss(ids, Tensor(), mask, labels, DType::F32);
  REQUIRE(loss.item() == Approx(expected).epsilon(1e-5));
  // The head on the labelled tokens only (flat indices, a padding row pointing at an unlabelled one): the
  // same loss and the same gradients.
  Tensor positions = Tensor::fromVector<int64_t>({1, 4, 6, 0}, {4});
  Tensor positionLabels = Tensor::fromVector<int64_t>({9, 11, 12, -100}, {4});
  auto gradients = [&](const Tensor& l) {
    bert.zeroGrad();
    backward(l);
    std::vector<double> out;
    for (auto& [name, p] : bert.namedParameters()) {
      auto g = p.grad().defined() ? p.grad().contiguous().toVector<double>()
                                  : std::vector<double>(size_t(p.numel()), 0.0);
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  Tensor rowsLoss = bert.mlmLoss(ids, Tensor(), mask, positionLabels, DType::F32, positions);
  REQUIRE(rowsLoss.item() == Approx(expected).epsilon(1e-5));
  auto full = gradients(bert.mlmLoss(ids, Tensor(), mask, labels, DType::F32));
  auto rows = gradients(rowsLoss);
  REQUIRE(test::closeness(rows, full, 1e-6, 1e-5) <= 1.0);
  Tensor nspProbe = Tensor::fromVector<int64_t>({0, 1}, {2});
  REQUIRE(
      bert.pretrainingLoss(ids, Tensor(), mask, positionLabels, nspProbe, DType::F32, positions).item() ==
      Approx(bert.pretrainingLoss(ids, Tensor(), mask, labels, nspProbe, DType::F32).item()).epsilon(1e-5));
  bert.zeroGrad();
  // Pre-training adds the NSP loss; every parameter gets a gradient (tied decoder, pooler and NSP included).
  Tensor nspLabels = Tensor::fromVector<int64_t>({0, 1}, {2});
  Tensor total = bert.pretrainingLoss(ids, Tensor(), mask, labels, nspLabels, DType::F32);
  REQUIRE(total.item() > loss.item());
  REQUIRE(bert.nspLogits(ids, Tensor(), mask, DType::F32).shape() == Shape({2, 2}));
  backward(total);
  for (auto& [name, p] : bert.namedParameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    REQUIRE(ops::sum(ops::mul(p.grad(), p.grad())).item() > 0.0);
  }
}

TEST_CASE("BERT HF layout: bert.* / cls.* names, q/k/v split and transposed, round trip",
          "[models][bert][hf]") {
  models::BertConfig c = tiny(true);
  models::Bert a(c);
  models::checkHfLayoutCovers(a, models::bertHfLayout(c));
  auto hf = models::exportHf(a, models::bertHfLayout(c));
  std::map<std::string, Tensor> byName(hf.begin(), hf.end());
  REQUIRE(byName.count("bert.embeddings.word_embeddings.weight"));
  REQUIRE(byName.count("cls.predictions.transform.LayerNorm.bias"));
  REQUIRE(byName.count("cls.seq_relationship.weight"));
  REQUIRE(byName.at("bert.encoder.layer.1.intermediate.dense.weight").shape() == Shape({128, 32}));
  // key = columns [C, 2C) of the packed qkv, as [out, in].
  Tensor key = byName.at("bert.encoder.layer.0.attention.self.key.weight");
  Tensor qkv;
  for (auto& [n, p] : a.namedParameters())
    if (n == "layer.0.attn.qkv.weight") qkv = p;
  test::requireClose(key, qkv.detach().narrow(1, 32, 32).transpose(0, 1).contiguous(), 0, 0);
  // Import into a differently seeded model reproduces every parameter and the outputs.
  c.seed = 99;
  models::Bert b(c);
  std::vector<std::string> unused;
  byName["cls.predictions.decoder.weight"] = byName.at("bert.embeddings.word_embeddings.weight");
  models::importHf(b, models::bertHfLayout(c), byName, &unused);
  REQUIRE(unused == std::vector<std::string>{"cls.predictions.decoder.weight"});
  auto pa = a.namedParameters(), pb = b.namedParameters();
  for (size_t i = 0; i < pa.size(); ++i) test::requireClose(pb[i].second, pa[i].second, 0, 0);
  byName.erase("bert.pooler.dense.bias");
  REQUIRE(test::errorOf([&] {
            models::importHf(b, models::bertHfLayout(c), byName);
          }).find("bert.pooler.dense.bias") != std::string::npos);
  REQUIRE(models::bertHfConfigJson(c).find("\"BertForPreTraining\"") != std::string::npos);
}

TEST_CASE("BERT's fp32 residual stream: bf16 sublayers around an fp32 stream, closer to fp32 than a bf16 one",
          "[models][bert]") {
  // NOTE [BERT's fp32 residual stream] in models/bert/BertLayer.h.
  models::BertConfig c = tiny();
  c.numLayers = 4;
  c.hiddenSize = 64;
  c.numHeads = 4;
  c.seqLength = 32;
  models::Bert plain(c);
  c.fp32Residual = true;
  models::Bert widened(c);
  std::vector<int64_t> tokens(128), targets(128);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int64_t((i * 7919 + 13) % 50);
    targets[i] = i % 5 == 0 ? int64_t((i * 104729 + 3) % 50) : -100;  // a fifth of the positions labelled
  }
  Tensor ids = Tensor::fromVector<int64_t>(tokens, {4, 32});
  Tensor labels = Tensor::fromVector<int64_t>(targets, {4, 32});
  auto run = [&](models::Bert& bert, DType compute, std::vector<double>* grads) {
    bert.zeroGrad();
    Tensor loss = bert.mlmLoss(ids, Tensor(), Tensor(), labels, compute);
    backward(loss);
    grads->clear();
    for (auto& [name, p] : bert.namedParameters()) {
      INFO(name);
      REQUIRE(p.grad().defined());
      auto g = p.grad().to(DType::F32).contiguous().toVector<double>();
      grads->insert(grads->end(), g.begin(), g.end());
    }
    return loss.item();
  };
  // In fp32 the option changes nothing.
  std::vector<double> g32, gWidened32, gBf16, gWidenedBf16;
  double l32 = run(plain, DType::F32, &g32);
  REQUIRE(run(widened, DType::F32, &gWidened32) == l32);
  REQUIRE(gWidened32 == g32);
  // In bf16 the stream between the layers is fp32 and the hidden states come back in bf16.
  plain.castParameters(DType::BF16);
  widened.castParameters(DType::BF16);
  REQUIRE(widened.encode(ids, Tensor(), Tensor(), DType::BF16).dtype() == DType::BF16);
  double lBf16 = run(plain, DType::BF16, &gBf16), lWidened = run(widened, DType::BF16, &gWidenedBf16);
  auto distance = [&](const std::vector<double>& g) {
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      num += (g[i] - g32[i]) * (g[i] - g32[i]);
      den += g32[i] * g32[i];
    }
    return std::sqrt(num / den);
  };
  double dBf16 = distance(gBf16), dWidened = distance(gWidenedBf16);
  WARN("loss fp32 " << l32 << ", bf16 stream " << lBf16 << ", fp32 stream " << lWidened
                    << "; gradients' relative L2 distance from fp32: bf16 stream " << dBf16
                    << ", fp32 stream " << dWidened);
  REQUIRE(std::abs(lWidened - l32) <= std::abs(lBf16 - l32) + 1e-3);
  REQUIRE(dWidened < dBf16);
}

TEST_CASE("BERT's [PAD]: its word-embedding row takes no gradient from lookups, as HF's padding_idx",
          "[models][bert]") {
  Tensor ids = Tensor::fromVector<int64_t>({5, 0, 0, 7, 0, 9}, {1, 6});
  std::map<int64_t, std::vector<double>> rowZero;  // the gradient of word row 0, by [PAD] id
  for (int64_t pad : {int64_t(0), int64_t(3)}) {
    models::BertConfig c = tiny();
    c.padTokenId = pad;
    models::Bert bert(c);
    // The encoder's output alone (projected: a LayerNorm's output sums to a constant), so no tied decoder
    // adds to the table's gradient.
    Tensor projection = test::randomDouble({1, 6, 32}, 7).to(DType::F32);
    backward(sum(mul(bert.encode(ids, Tensor(), Tensor(), DType::F32), projection)));
    Tensor grad;
    for (auto& [name, p] : bert.namedParameters())
      if (name == "embeddings.word.weight") grad = p.grad();
    rowZero[pad] = grad.narrow(0, 0, 1).contiguous().toVector<double>();
    std::vector<double> row5 = grad.narrow(0, 5, 1).contiguous().toVector<double>();
    REQUIRE(std::any_of(row5.begin(), row5.end(), [](double g) { return g != 0.0; }));
  }
  REQUIRE(std::all_of(rowZero[0].begin(), rowZero[0].end(), [](double g) { return g == 0.0; }));
  REQUIRE(std::any_of(rowZero[3].begin(), rowZero[3].end(), [](double g) { return g != 0.0; }));
  // The default [PAD] is the byte layout's, vocab_size - 4; an id outside the vocabulary is refused.
  REQUIRE(tiny().padId() == 46);
  models::BertConfig bad = tiny();
  bad.padTokenId = 50;
  REQUIRE(test::errorOf([&] { models::Bert b(bad); }).find("model.pad_token_id") != std::string::npos);
}

TEST_CASE("BERT's position table (model.max_position_embeddings) is longer than the sequence it trains at",
          "[models][bert][hf]") {
  models::ModelSpec s = tinySpec();
  s.maxPositionEmbeddings = 40;
  auto shapes = models::parameterShapes(s);
  REQUIRE(shapes[1] == std::make_pair(std::string("embeddings.position.weight"), Shape{40, 32}));
  models::Bert bert(models::bertConfig(s));
  // A sequence longer than seq_length (16) fits the table; one past the table does not.
  REQUIRE(bert.encode(ops::zeros({1, 40}, DType::I64), Tensor(), Tensor(), DType::F32).size(1) == 40);
  REQUIRE(test::errorOf([&] {
            bert.encode(ops::zeros({1, 41}, DType::I64), Tensor(), Tensor(), DType::F32);
          }).find("exceeds the 40 positions") != std::string::npos);
  REQUIRE(models::describeShape(s).find("seq 16 (40 positions)") != std::string::npos);
  s.maxPositionEmbeddings = 8;
  REQUIRE(test::errorOf([&] { models::buildModule(s); }).find("model.max_position_embeddings (8)") !=
          std::string::npos);
}

TEST_CASE("BERT's HF config.json: the table's rows and the model's [PAD] (256 for byte-level bert-mini)",
          "[models][bert][hf]") {
  models::ModelSpec s = tinySpec();
  s.vocabSize = 260;
  s.seqLength = 128;
  nlohmann::json j = nlohmann::json::parse(models::bertHfConfigJson(models::bertConfig(s)));
  REQUIRE(j.at("pad_token_id") == 256);
  REQUIRE(j.at("max_position_embeddings") == 128);
  s.padTokenId = 0;
  s.maxPositionEmbeddings = 512;
  j = nlohmann::json::parse(models::bertHfConfigJson(models::bertConfig(s)));
  REQUIRE(j.at("pad_token_id") == 0);
  REQUIRE(j.at("max_position_embeddings") == 512);
}
