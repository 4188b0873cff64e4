// A portable, seeded 64-bit mix for the draws that must not depend on the standard library's generators
// (per-GPU speed, node placement, ECMP path hashes): the same scenario gives the same numbers everywhere.
#pragma once

#include <cstdint>

namespace hzp {

// splitmix64's finaliser (Steele, Lea & Flood, OOPSLA 2014): a bijection, so distinct inputs give unrelated bits.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace hzp
