// Sentence embeddings as sentence-transformers computes them for a BERT model (all-MiniLM-L6-v2 and its
// kind): WordPiece ids [CLS] text [SEP] (truncated to max_seq_length), BertModel's last hidden states, their
// mean over the real tokens (the attention mask), L2-normalised. `strata embed` prints them.
//
// A model directory as sentence-transformers and HF save one:
// - config.json: model_type bert (BertModel; the MLM and NSP heads, when present, are not used);
// - model.safetensors: BertModel's tensors ("embeddings.*", "encoder.*"), or a BertFor*'s ("bert.*");
// - vocab.txt, lower-cased as tokenizer_config.json's do_lower_case says (default: lower-case);
// - optionally sentence_bert_config.json (max_seq_length; without it the model's positions) and
//   1_Pooling/config.json, which must ask for mean pooling (the only pooling this computes).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/bert/Bert.h"
#include "strata/data/WordPieceTokenizer.h"

namespace strata::interop {

struct SentenceEmbedderOptions {
  Device device = Device::cpu();
  int64_t batchSize = 32;    // sentences per forward (padded to the longest of them)
  int64_t maxSeqLength = 0;  // tokens per sentence, [CLS] and [SEP] included; 0: the directory's
};

class SentenceEmbedder {
 public:
  explicit SentenceEmbedder(const std::string& modelDir, const SentenceEmbedderOptions& options = {});

  // One unit-length vector of dimension() floats per text.
  std::vector<std::vector<float>> embed(const std::vector<std::string>& texts) const;
  // The ids a text becomes: [CLS] pieces [SEP], at most maxSeqLength() of them.
  std::vector<int64_t> tokenIds(const std::string& text) const;

  int64_t dimension() const { return model_->config().hiddenSize; }
  int64_t maxSeqLength() const { return maxSeqLength_; }
  const data::WordPieceTokenizer& tokenizer() const { return *tokenizer_; }

 private:
  SentenceEmbedderOptions options_;
  std::shared_ptr<models::Bert> model_;
  std::unique_ptr<data::WordPieceTokenizer> tokenizer_;
  int64_t maxSeqLength_ = 0, cls_ = -1, sep_ = -1, pad_ = -1;
};

}  // namespace strata::interop
