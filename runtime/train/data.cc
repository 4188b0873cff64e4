#include "runtime/train/data.h"

#include "shared/base/files.h"
#include "shared/base/text.h"

namespace hzp::runtime {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Result<ByteDataset> ByteDataset::load(const std::string& path, std::int64_t seq_len) {
  auto text = read_text_file(path, kMaxDataBytes);
  if (!text.ok()) return Status::InvalidInput("--data: " + text.status().message());
  ByteDataset d;
  d.text_ = std::move(text).value();
  d.seq_len_ = seq_len;
  d.split_ = static_cast<std::int64_t>(d.text_.size()) * 9 / 10;
  if (d.val_bytes() < 4 * (seq_len + 1))
    return Status::InvalidInput("--data: " + printable(path, 200) + " has " + std::to_string(d.text_.size()) +
                                " bytes, too few for a validation split of sequences of " + std::to_string(seq_len) +
                                " tokens");
  return d;
}

std::uint64_t ByteDataset::content_hash() const {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the bytes, then the split and the random vocabulary
  for (unsigned char c : text_) h = (h ^ c) * 0x100000001b3ULL;
  return splitmix64(h ^ splitmix64(static_cast<std::uint64_t>(split_) ^ splitmix64(random_vocab_)));
}

ByteDataset ByteDataset::random_tokens(std::int64_t vocab, std::int64_t seq_len) {
  ByteDataset d;
  d.seq_len_ = seq_len;
  d.random_vocab_ = vocab;
  return d;
}

// Token t of sequence b of the group with key `key`: a function of (key, b, t) alone.
void ByteDataset::fill_random(std::uint64_t key, std::int64_t micro_batch, std::vector<std::int32_t>& tokens,
                              std::vector<std::int32_t>& targets) const {
  tokens.resize(micro_batch * seq_len_);
  targets.resize(micro_batch * seq_len_);
  const auto vocab = static_cast<std::uint64_t>(random_vocab_);
  for (std::int64_t b = 0; b < micro_batch; ++b) {
    const std::uint64_t stream = splitmix64(key ^ splitmix64(static_cast<std::uint64_t>(b) + 0x5851f42d4c957f2dull));
    auto token = [&](std::int64_t t) {
      return static_cast<std::int32_t>(splitmix64(stream + static_cast<std::uint64_t>(t)) % vocab);
    };
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      tokens[b * seq_len_ + t] = token(t);
      targets[b * seq_len_ + t] = token(t + 1);
    }
  }
}

void ByteDataset::fill(std::int64_t begin, std::int64_t length, std::uint64_t key, std::int64_t micro_batch,
                       std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) const {
  const std::int64_t span = length - seq_len_ - 1;
  tokens.resize(micro_batch * seq_len_);
  targets.resize(micro_batch * seq_len_);
  for (std::int64_t b = 0; b < micro_batch; ++b) {
    const std::uint64_t r = splitmix64(key ^ splitmix64(static_cast<std::uint64_t>(b) + 0x5851f42d4c957f2dull));
    const std::int64_t start = begin + static_cast<std::int64_t>(r % static_cast<std::uint64_t>(span));
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      tokens[b * seq_len_ + t] = static_cast<unsigned char>(text_[start + t]);
      targets[b * seq_len_ + t] = static_cast<unsigned char>(text_[start + t + 1]);
    }
  }
}

void ByteDataset::train_batch(std::uint64_t seed, std::int64_t step, std::int64_t group, std::int64_t micro_batch,
                              std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) const {
  if (random_vocab_ > 0)  // the same batches every step
    return fill_random(splitmix64(splitmix64(seed) ^ static_cast<std::uint64_t>(group)), micro_batch, tokens, targets);
  const std::uint64_t key =
      splitmix64(splitmix64(seed) ^ splitmix64(static_cast<std::uint64_t>(step) * 1000003ull + group));
  fill(0, split_, key, micro_batch, tokens, targets);
}

void ByteDataset::val_batch(std::uint64_t seed, std::int64_t group, std::int64_t micro_batch,
                            std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) const {
  if (random_vocab_ > 0) return train_batch(seed, 0, group, micro_batch, tokens, targets);
  const std::uint64_t key = splitmix64(splitmix64(seed + 0x7a11d) ^ splitmix64(static_cast<std::uint64_t>(group)));
  fill(split_, val_bytes(), key, micro_batch, tokens, targets);
}

}  // namespace hzp::runtime
