// The element types of device buffers (ScalarType) and the host-side arithmetic of the 16-bit formats:
// bfloat16 and IEEE binary16 values as bit patterns, converted from fp32 with round-to-nearest-even (the
// rounding of CUDA's __float2bfloat16 / __float2half and of PyTorch's .to(dtype)), overflow to infinity,
// subnormals kept, NaN kept NaN (quiet). Conversion to fp32 is exact.
//
// The CPU reference backend rounds every reduced-precision result through these functions, so a GPU kernel
// can be compared with it element by element; host code that prepares or reads 16-bit buffers (tests,
// checkpoints) uses them too.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "shared/ir/schedule.h"

namespace hzp::runtime {

// What a device buffer holds. The floating types are the schedule's DTypes plus fp64 (accumulators of
// norms and losses); the integer types hold token ids, expert choices, counts and offsets.
enum class ScalarType { kFp32, kBf16, kFp16, kFp64, kInt32, kInt64 };

constexpr int scalar_bytes(ScalarType t) {
  switch (t) {
    case ScalarType::kBf16:
    case ScalarType::kFp16:
      return 2;
    case ScalarType::kFp32:
    case ScalarType::kInt32:
      return 4;
    case ScalarType::kFp64:
    case ScalarType::kInt64:
      return 8;
  }
  return 0;
}

constexpr bool is_floating(ScalarType t) {
  return t == ScalarType::kFp32 || t == ScalarType::kBf16 || t == ScalarType::kFp16 || t == ScalarType::kFp64;
}
// The types model tensors (parameters, activations, gradients) may have.
constexpr bool is_tensor_type(ScalarType t) {
  return t == ScalarType::kFp32 || t == ScalarType::kBf16 || t == ScalarType::kFp16;
}

const char* to_string(ScalarType t);
ScalarType scalar_type(DType d);  // the schedule's dtype as a buffer type

// --- bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an fp32) ----------------------------

struct Bf16 {
  std::uint16_t bits = 0;
};

inline Bf16 to_bf16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. A carry out of the
  // mantissa bumps the exponent (correct rounding up to the next binade, or to infinity past the largest).
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<std::uint16_t>(rounded >> 16)};
}

inline float from_bf16(Bf16 b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16);
}

// --- IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; largest finite 65504 ---------------

struct Fp16 {
  std::uint16_t bits = 0;
};

inline Fp16 to_fp16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return Fp16{static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN (quiet)
  if (a >= 0x477ff000u) return Fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520: rounds to inf
  const int exp = static_cast<int>(a >> 23) - 127;                                // unbiased fp32 exponent
  if (exp >= -14) {
    // Normal half: keep 10 of the 23 mantissa bits, rounding the 13 dropped ones to nearest even; a carry
    // propagates into the exponent field, which is the correct result.
    const std::uint32_t mant = a & 0x7fffffu;
    std::uint32_t h = (static_cast<std::uint32_t>(exp + 15) << 10) | (mant >> 13);
    const std::uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return Fp16{static_cast<std::uint16_t>(sign | h)};
  }
  if (exp < -25) return Fp16{sign};  // below half the smallest subnormal (2^-25): rounds to zero
  // Subnormal half: value = m * 2^-24 with m = round(a * 2^24); the implicit bit joins the mantissa.
  const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 1;  // 14 .. 24: bits dropped from the 24-bit significand to leave m
  std::uint32_t h = mant >> shift;
  const std::uint32_t rest = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;  // may carry into the smallest normal: correct
  return Fp16{static_cast<std::uint16_t>(sign | h)};
}

inline float from_fp16(Fp16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  const std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in fp32.
  const float v = static_cast<float>(mant) * 0x1.0p-24f;
  return sign != 0 ? -v : v;
}

// The value of `f` after a round trip through `t` (identity for fp32): what storing f in a buffer of type
// t keeps.
inline float round_to(ScalarType t, float f) {
  switch (t) {
    case ScalarType::kBf16:
      return from_bf16(to_bf16(f));
    case ScalarType::kFp16:
      return from_fp16(to_fp16(f));
    default:
      return f;
  }
}

// Host-side conversions of whole arrays between fp32 and a buffer type's bytes (`bytes` holds
// count * scalar_bytes(t)): for initialising parameters and for checkpoints and tests.
void encode_floats(ScalarType t, const float* in, std::int64_t count, void* bytes);
void decode_floats(ScalarType t, const void* bytes, std::int64_t count, float* out);

}  // namespace hzp::runtime
