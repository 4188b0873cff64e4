// Byte-level language-model data: the tokenizer is the identity on bytes (vocabulary 256), the text is split
// into a training part (first 90 %) and a validation part (last 10 %).
//
// Batches are a pure function of (seed, step, index): sequence j of step s starts at a pseudo-random offset
// drawn from splitmix64(seed, s, j). A global batch of G = global_batch / micro_batch micro-batch groups is
// dealt to ranks as group = micro_batch_index * D + rank, so every world size trains on exactly the same
// sequences, grouped the same way (which the equivalence tests rely on), and resuming at step s needs no
// saved data state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/base/status.h"

namespace hzp::runtime {

class ByteDataset {
 public:
  static constexpr std::int64_t kMaxDataBytes = 1ll << 30;  // the whole text is held in memory
  // `--data random`: the name that selects random_tokens() instead of a file.
  static constexpr const char* kRandom = "random";
  // Reads the whole file; it must hold at least a few sequences in each split (error otherwise).
  static Result<ByteDataset> load(const std::string& path, std::int64_t seq_len);
  // Uniformly random tokens over `vocab`, for speed benchmarks at any vocabulary: micro-batch group g gets the
  // same sequences at every step (as PyTorch benchmark loops reuse one batch), so the loss falls as the model
  // memorises them; validation group g is training group g (those past the step's groups were never trained
  // on). Targets are the next token of the same stream.
  static ByteDataset random_tokens(std::int64_t vocab, std::int64_t seq_len);

  std::int64_t vocab() const { return random_vocab_ > 0 ? random_vocab_ : 256; }

  std::int64_t train_bytes() const { return split_; }
  // A hash of what the batches are drawn from (the text, or the random tokens' vocabulary): ranks that disagree
  // on it would train on different data.
  std::uint64_t content_hash() const;
  std::int64_t val_bytes() const { return static_cast<std::int64_t>(text_.size()) - split_; }

  // Tokens and next-token targets of micro-batch group `group` of training step `step`: `micro_batch`
  // sequences of seq_len tokens, row-major.
  void train_batch(std::uint64_t seed, std::int64_t step, std::int64_t group, std::int64_t micro_batch,
                   std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) const;
  // Validation micro-batch group `group` (the same for every evaluation).
  void val_batch(std::uint64_t seed, std::int64_t group, std::int64_t micro_batch, std::vector<std::int32_t>& tokens,
                 std::vector<std::int32_t>& targets) const;

 private:
  void fill(std::int64_t begin, std::int64_t length, std::uint64_t key, std::int64_t micro_batch,
            std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) const;
  void fill_random(std::uint64_t key, std::int64_t micro_batch, std::vector<std::int32_t>& tokens,
                   std::vector<std::int32_t>& targets) const;
  std::string text_;
  std::int64_t split_ = 0;
  std::int64_t seq_len_ = 0;
  std::int64_t random_vocab_ = 0;  // > 0: random tokens, no text
};

std::uint64_t splitmix64(std::uint64_t x);

}  // namespace hzp::runtime
