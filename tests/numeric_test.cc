// The 16-bit conversions of runtime/device/numeric.h against independent references: round-to-nearest-even
// computed in double arithmetic (the nearer of the two neighbouring representable values, ties to the even
// significand, overflow to infinity), and for fp16 also GCC's _Float16 conversion where the compiler has it.
// Inputs: every 97th fp32 bit pattern (all signs, exponents, subnormals, infinities and NaNs), every value of
// each 16-bit format with its halfway points and their neighbours, and named special cases.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/device/numeric.h"

namespace hzp::runtime {
namespace {

// A binary floating format: `p` significand bits (the implicit one included), smallest normal 2^emin, largest
// finite `max_finite`.
struct Format {
  const char* name;
  int p;
  int emin;
  double max_finite;
};
const Format kBf16Format{"bf16", 8, -126, (2.0 - 0x1p-7) * 0x1p127};
const Format kFp16Format{"fp16", 11, -14, 65504.0};

// The value of `fmt` nearest to the finite double `a`, ties to even; +-inf past the largest finite (IEEE: a
// value rounds to infinity when rounding with an unbounded exponent gives more than the largest finite).
double round_reference(const Format& fmt, double a) {
  if (a == 0) return a;
  const double mag = std::fabs(a);
  int e = 0;
  std::frexp(mag, &e);                        // mag = f 2^e, f in [0.5, 1): the exponent of mag is e - 1
  const int exp = std::max(e - 1, fmt.emin);  // subnormals share the smallest normal's spacing
  const double ulp = std::ldexp(1.0, exp - (fmt.p - 1));
  const double q = mag / ulp;  // exact: a power-of-two scaling
  const double lo = std::floor(q);
  const double rest = q - lo;
  double n = lo;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(lo, 2.0) != 0.0)) n = lo + 1;
  double r = n * ulp;
  if (r > fmt.max_finite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, a);
}

// Independent decoders: sign, exponent field and mantissa to a double by ldexp.
double decode_reference(std::uint16_t bits, int exp_bits, int mant_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int e = (bits >> mant_bits) & ((1 << exp_bits) - 1);
  const int m = bits & ((1 << mant_bits) - 1);
  const double sign = (bits >> 15) != 0 ? -1.0 : 1.0;
  if (e == (1 << exp_bits) - 1)
    return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
  return sign * std::ldexp(static_cast<double>(m + (1 << mant_bits)), e - bias - mant_bits);
}
double decode_bf16_reference(std::uint16_t bits) {
  return decode_reference(bits, 8, 7);
}
double decode_fp16_reference(std::uint16_t bits) {
  return decode_reference(bits, 5, 10);
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

std::string hex(std::uint32_t u) {
  std::ostringstream s;
  s << "0x" << std::hex << u;
  return s.str();
}

// Collects mismatches; reports the count and the first few.
struct Mismatches {
  std::int64_t count = 0, checked = 0;
  std::string first;
  // `describe` (a callable returning the message) runs only for a mismatch.
  template <typename F>
  void add(bool ok, F&& describe) {
    ++checked;
    if (ok) return;
    if (count < 8) first += "\n  " + describe();
    ++count;
  }
};

// One input through to_bf16 / to_fp16 against the references.
void check_one(float f, Mismatches& bf, Mismatches& fp, Mismatches* native) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const Bf16 b = to_bf16(f);
  const Fp16 h = to_fp16(f);
  if (std::isnan(f)) {
    // NaN stays NaN, quiet (bf16: bit 6 of the mantissa; fp16: bit 9).
    bf.add(std::isnan(from_bf16(b)) && (b.bits & 0x0040u) != 0,
           [&] { return "bf16 of NaN " + hex(u) + " -> " + hex(b.bits); });
    fp.add(std::isnan(from_fp16(h)) && (h.bits & 0x0200u) != 0,
           [&] { return "fp16 of NaN " + hex(u) + " -> " + hex(h.bits); });
  } else {
    const float want_b = static_cast<float>(round_reference(kBf16Format, f));
    const float want_h = static_cast<float>(round_reference(kFp16Format, f));
    bf.add(same_float(from_bf16(b), want_b), [&] { return "bf16 of " + hex(u) + " -> " + hex(b.bits); });
    fp.add(same_float(from_fp16(h), want_h), [&] { return "fp16 of " + hex(u) + " -> " + hex(h.bits); });
  }
#if defined(__FLT16_MAX__)
  if (native != nullptr) {
    const _Float16 n = static_cast<_Float16>(f);
    const std::uint16_t nb = std::bit_cast<std::uint16_t>(n);
    const bool ok = std::isnan(f) ? std::isnan(from_fp16(h)) : nb == h.bits;
    native->add(ok, [&] { return "fp16 of " + hex(u) + ": to_fp16 " + hex(h.bits) + ", _Float16 " + hex(nb); });
  }
#else
  static_cast<void>(native);
#endif
}

void require_none(const Mismatches& m, const std::string& what) {
  INFO(what << ": " << m.count << " mismatches of " << m.checked << " inputs; first:" << m.first);
  CHECK(m.checked > 0);
  CHECK(m.count == 0);
}

TEST_CASE("numeric to_bf16 and to_fp16 round every 97th fp32 bit pattern to nearest even", "[numeric]") {
  Mismatches bf, fp, native;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 97)
    check_one(std::bit_cast<float>(static_cast<std::uint32_t>(u)), bf, fp, &native);
  require_none(bf, "to_bf16 against the double reference");
  require_none(fp, "to_fp16 against the double reference");
#if defined(__FLT16_MAX__)
  require_none(native, "to_fp16 against _Float16");
#endif
}

TEST_CASE("numeric to_bf16 and to_fp16 on special cases", "[numeric]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> cases = {
      0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7f800001u),
      std::bit_cast<float>(0xff800001u),  // signalling
      std::bit_cast<float>(0x7fffffffu), std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
      std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
      -std::numeric_limits<float>::denorm_min(),
      // bf16: largest finite, the tie above it (-> inf), just below that tie
      std::bit_cast<float>(0x7f7f0000u), std::bit_cast<float>(0x7f7f8000u), std::bit_cast<float>(0x7f7f7fffu),
      // bf16 ties around 1 and at the subnormal boundary
      1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0x1p-134f, 3 * 0x1p-134f, 0x1p-126f - 0x1p-134f,
      // fp16: largest finite, below / at the overflow threshold 65520, ties, subnormals
      65504.0f, 65519.99609375f, 65520.0f, -65520.0f, 65536.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 2048.0f + 1.0f,
      2048.0f + 3.0f, 0x1p-24f, 0x1p-25f, -0x1p-25f, std::nextafter(0x1p-25f, 1.0f), 3 * 0x1p-25f, 0x1p-14f,
      0x1p-14f - 0x1p-25f, 0x1p-14f - 0x1p-24f, 1023 * 0x1p-24f, 0x1p-26f};
  Mismatches bf, fp, native;
  for (float f : cases) check_one(f, bf, fp, &native);
  require_none(bf, "to_bf16 specials");
  require_none(fp, "to_fp16 specials");
#if defined(__FLT16_MAX__)
  require_none(native, "to_fp16 specials against _Float16");
#endif
  // A few spelled out.
  CHECK(to_bf16(0.0f).bits == 0x0000);
  CHECK(to_bf16(-0.0f).bits == 0x8000);
  CHECK(to_bf16(inf).bits == 0x7f80);
  CHECK(to_bf16(-inf).bits == 0xff80);
  CHECK(to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds past the largest bf16
  CHECK(to_bf16(std::bit_cast<float>(0x7f7f8000u)).bits == 0x7f80);
  CHECK(to_bf16(std::bit_cast<float>(0x7f7f7fffu)).bits == 0x7f7f);
  CHECK(to_bf16(1.0f + 0x1p-8f).bits == 0x3f80);      // tie to even: 1
  CHECK(to_bf16(1.0f + 3 * 0x1p-8f).bits == 0x3f82);  // tie to even: 1 + 2^-6
  CHECK(to_fp16(65504.0f).bits == 0x7bff);
  CHECK(to_fp16(65519.99609375f).bits == 0x7bff);
  CHECK(to_fp16(65520.0f).bits == 0x7c00);
  CHECK(to_fp16(-65520.0f).bits == 0xfc00);
  CHECK(to_fp16(1.0f + 0x1p-11f).bits == 0x3c00);
  CHECK(to_fp16(1.0f + 3 * 0x1p-11f).bits == 0x3c02);
  CHECK(to_fp16(0x1p-24f).bits == 0x0001);
  CHECK(to_fp16(0x1p-25f).bits == 0x0000);  // tie between 0 and the smallest subnormal: 0
  CHECK(to_fp16(-0x1p-25f).bits == 0x8000);
  CHECK(to_fp16(3 * 0x1p-25f).bits == 0x0002);
  CHECK(to_fp16(0x1p-14f - 0x1p-25f).bits == 0x0400);  // tie between the largest subnormal (odd) and 2^-14
  CHECK(to_fp16(0.0f).bits == 0x0000);
  CHECK(to_fp16(-0.0f).bits == 0x8000);
  CHECK(to_fp16(inf).bits == 0x7c00);
}

// Every value of a 16-bit format, its halfway points to the next value up in magnitude, and their float
// neighbours: values round to themselves, ties to the even one, the neighbours to the nearer.
void check_all_halfway_points(const Format& fmt, double (*decode)(std::uint16_t), std::uint16_t inf_bits,
                              Mismatches& bf, Mismatches& fp, Mismatches& native) {
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t mag = 0; mag < inf_bits; ++mag) {
      const auto bits = static_cast<std::uint16_t>((sign << 15) | mag);
      const double v = decode(bits);
      const double next = mag + 1 == inf_bits ? std::copysign(std::ldexp(1.0, fmt.emin == -126 ? 128 : 16), v)
                                              : decode(static_cast<std::uint16_t>(bits + 1));
      const float mid = static_cast<float>((v + next) / 2);  // exact in fp32 for both formats
      bf.add(static_cast<double>(mid) == (v + next) / 2, [&] { return "halfway point of " + hex(bits) + " inexact"; });
      for (float f :
           {static_cast<float>(v), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, static_cast<float>(2 * next))})
        check_one(f, bf, fp, &native);
    }
}

TEST_CASE("numeric every bf16 and fp16 value, its halfway points and their neighbours round correctly", "[numeric]") {
  Mismatches bf, fp, native;
  check_all_halfway_points(kBf16Format, decode_bf16_reference, 0x7f80, bf, fp, native);
  check_all_halfway_points(kFp16Format, decode_fp16_reference, 0x7c00, bf, fp, native);
  require_none(bf, "to_bf16 at halfway points");
  require_none(fp, "to_fp16 at halfway points");
#if defined(__FLT16_MAX__)
  require_none(native, "to_fp16 at halfway points against _Float16");
#endif
}

TEST_CASE("numeric from_bf16 and from_fp16 are exact and to_bf16 / to_fp16 invert them on all 65536 patterns",
          "[numeric]") {
  Mismatches bf_decode, fp_decode, bf_round_trip, fp_round_trip, native;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto bits = static_cast<std::uint16_t>(i);
    const float b = from_bf16(Bf16{bits});
    const float h = from_fp16(Fp16{bits});
    const double rb = decode_bf16_reference(bits), rh = decode_fp16_reference(bits);
    bf_decode.add(std::isnan(rb) ? std::isnan(b) : same_float(b, static_cast<float>(rb)),
                  [&] { return "from_bf16 " + hex(i); });
    fp_decode.add(std::isnan(rh) ? std::isnan(h) : same_float(h, static_cast<float>(rh)),
                  [&] { return "from_fp16 " + hex(i); });
    bf_round_trip.add(std::isnan(b) ? std::isnan(from_bf16(to_bf16(b))) : to_bf16(b).bits == bits,
                      [&] { return "to_bf16(from_bf16(" + hex(i) + ")) = " + hex(to_bf16(b).bits); });
    fp_round_trip.add(std::isnan(h) ? std::isnan(from_fp16(to_fp16(h))) : to_fp16(h).bits == bits,
                      [&] { return "to_fp16(from_fp16(" + hex(i) + ")) = " + hex(to_fp16(h).bits); });
#if defined(__FLT16_MAX__)
    const float nf = static_cast<float>(std::bit_cast<_Float16>(bits));
    native.add(same_float(h, nf), [&] { return "from_fp16 " + hex(i) + " against _Float16"; });
#endif
  }
  require_none(bf_decode, "from_bf16 against the ldexp decoder");
  require_none(fp_decode, "from_fp16 against the ldexp decoder");
  require_none(bf_round_trip, "to_bf16 inverts from_bf16");
  require_none(fp_round_trip, "to_fp16 inverts from_fp16");
#if defined(__FLT16_MAX__)
  require_none(native, "from_fp16 against _Float16");
#endif
}

TEST_CASE("numeric round_to and encode_floats / decode_floats agree with the scalar conversions", "[numeric]") {
  std::vector<float> in;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 104729)
    in.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  in.push_back(65520.0f);
  in.push_back(1.0f + 0x1p-8f);
  const auto n = static_cast<std::int64_t>(in.size());
  for (ScalarType t : {ScalarType::kFp32, ScalarType::kBf16, ScalarType::kFp16, ScalarType::kFp64}) {
    std::vector<char> bytes(in.size() * static_cast<std::size_t>(scalar_bytes(t)));
    encode_floats(t, in.data(), n, bytes.data());
    std::vector<float> out(in.size());
    decode_floats(t, bytes.data(), n, out.data());
    Mismatches m;
    for (std::size_t i = 0; i < in.size(); ++i) {
      float want = in[i];
      if (t == ScalarType::kBf16) want = from_bf16(to_bf16(in[i]));
      if (t == ScalarType::kFp16) want = from_fp16(to_fp16(in[i]));
      m.add(same_float(out[i], want) && same_float(round_to(t, in[i]), want),
            [&] { return std::string(to_string(t)) + " of " + hex(std::bit_cast<std::uint32_t>(in[i])); });
      if (t == ScalarType::kBf16) {
        std::uint16_t stored = 0;
        std::memcpy(&stored, bytes.data() + 2 * i, 2);
        m.add(stored == to_bf16(in[i]).bits,
              [&] { return "bf16 bytes of " + hex(std::bit_cast<std::uint32_t>(in[i])); });
      }
      if (t == ScalarType::kFp16) {
        std::uint16_t stored = 0;
        std::memcpy(&stored, bytes.data() + 2 * i, 2);
        m.add(stored == to_fp16(in[i]).bits,
              [&] { return "fp16 bytes of " + hex(std::bit_cast<std::uint32_t>(in[i])); });
      }
    }
    require_none(m, std::string("encode / decode ") + to_string(t));
  }
}

}  // namespace
}  // namespace hzp::runtime
