// The fuzzer's own pseudo-random generator: xoshiro256** seeded through splitmix64 (Blackman & Vigna,
// "Scrambled linear pseudorandom number generators", 2021). Deterministic on every platform, so a seed and a
// case index name one input forever; no std::random_device and no std:: distributions (whose output is
// implementation-defined).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace hzp::fuzz {

// One step of splitmix64: also used to mix seeds, target names and case indices into a case's seed.
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// FNV-1a of a name: folds a target's name into its cases' seeds.
inline std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (std::uint64_t& word : s_) word = splitmix64(seed);
  }

  // The seed of case `index` of `target` under the run's seed: each case can be regenerated on its own.
  static std::uint64_t case_seed(std::uint64_t run_seed, std::string_view target, std::uint64_t index) {
    std::uint64_t state = run_seed ^ hash_name(target);
    splitmix64(state);
    state ^= index * 0xd1342543de82ef95ULL;
    return splitmix64(state);
  }

  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n) (n > 0); the modulo bias is irrelevant for fuzzing.
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  // Uniform in [lo, hi].
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  // True with probability `percent` / 100.
  bool chance(int percent) { return below(100) < static_cast<std::size_t>(percent); }

  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[below(items.size())];
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace hzp::fuzz
