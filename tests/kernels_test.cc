// The kernel interface (runtime/device/kernels.h) against independent fp64 references, for any backend: the
// backend comes from HZP_KERNEL_BACKEND (default "cpu"), so the same binary checks the CPU reference and, on a
// GPU machine, the CUDA kernels (HZP_KERNEL_BACKEND=cuda build/tests/hzp_kernel_tests). Where the backend is not
// in the build or its device cannot be made (no GPU), every test exits 77 (ctest "skipped") with the reason.
//
// The tests touch device memory only through Kernels::copy_from_host / copy_to_host and read host memory after a
// stream synchronisation, so they hold for a backend that enqueues (a GPU) as for one that computes at once.
//
// Every reference is a plain loop in double written from kernels.h, on the same inputs the backend gets: inputs
// of 16-bit runs are drawn in fp32 and rounded to the type first. Errors are max |got - reference| over
// max |reference| (the scale; 1 where the reference is all zero), against per-type tolerances:
//   fp32 1e-5, bf16 1e-2, fp16 2e-3 (the arithmetic: a GPU may round intermediates such as attention's
//   probabilities to the input type), times sqrt(n / 256) for reductions over n > 256 terms, plus one ulp of
//   the output type (2^-23, 2^-7, 2^-10 relative to the scale) for the rounding of the result itself.
// Finite-difference checks (type "fp32-fd") run in fp32 on small cases: every backward kernel against central
// differences of L = sum(out * R) over its forward's output (R random; cross-entropy: the loss itself). Attention,
// cross-entropy and the router are checked on every coordinate; the others along a random direction and on a few
// coordinates, with eps 0.1 where the forward is linear in the perturbed input and 1e-2 otherwise, and bounds of
// about ten times the CPU backend's largest error (at least 1e-5, fp32's base tolerance, where the differences
// are exact but for rounding).
//
// At the end of a run one line per (kernel, type) gives the largest error seen and its tolerance, the table
// the GPU runs record. HZP_KERNEL_TEST_VERBOSE=1 also prints every comparison.
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // the listener that prints the error table
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/device/expert_products.h"
#include "runtime/device/kernels.h"
#include "runtime/device/numeric.h"
#include "runtime/device/registry.h"

namespace hzp::runtime {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
using I32 = std::vector<std::int32_t>;
using I64 = std::vector<std::int64_t>;

constexpr ScalarType kF32 = ScalarType::kFp32;
constexpr ScalarType kBf16 = ScalarType::kBf16;
constexpr ScalarType kF16 = ScalarType::kFp16;
constexpr ScalarType kF64 = ScalarType::kFp64;
constexpr ScalarType kI32 = ScalarType::kInt32;
constexpr ScalarType kI64 = ScalarType::kInt64;
constexpr ScalarType kTensorTypes[] = {kF32, kBf16, kF16};
constexpr ScalarType kFloatTypes[] = {kF32, kBf16, kF16, kF64};

std::size_t sz(std::int64_t n) {
  return static_cast<std::size_t>(n);
}

bool verbose() {
  const char* v = std::getenv("HZP_KERNEL_TEST_VERBOSE");
  return v != nullptr && *v != '\0' && *v != '0';
}

// --- The backend under test ------------------------------------------------------------------------------

struct Env {
  std::string backend;
  std::unique_ptr<Device> device;
};

// The device of HZP_KERNEL_BACKEND, made once per process; exits 77 with the reason where it cannot be made.
Env& env() {
  static Env* const instance = [] {
    auto* e = new Env;  // never destroyed: a GPU device outlives static destruction order questions
    const char* name = std::getenv("HZP_KERNEL_BACKEND");
    e->backend = name != nullptr && *name != '\0' ? name : "cpu";
    Result<std::unique_ptr<Device>> device = make_device(e->backend, BackendOptions{});
    if (!device.ok() || *device == nullptr) {
      std::fflush(stdout);
      std::fprintf(stderr, "hzp_kernel_tests: SKIPPED: backend '%s' cannot be used here: %s\n", e->backend.c_str(),
                   device.ok() ? "make_device returned no device" : device.status().message().c_str());
      std::fflush(stderr);
      std::_Exit(77);
    }
    e->device = std::move(device).value();
    std::printf("hzp_kernel_tests: backend %s (%s)\n", e->backend.c_str(), e->device->description().c_str());
    std::fflush(stdout);
    return e;
  }();
  return *instance;
}

// --- The error table -----------------------------------------------------------------------------------------

struct ErrorRow {
  std::string kernel, type;
  double err = 0, tol = 0;  // of the comparison closest to (or furthest past) its tolerance
  int checks = 0;
  bool failed = false;
};

std::vector<ErrorRow>& error_table() {
  static std::vector<ErrorRow> table;
  return table;
}

double badness(double err, double tol) {
  if (std::isnan(err)) return std::numeric_limits<double>::infinity();
  if (tol > 0) return err / tol;
  return err > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

void record(const std::string& kernel, const std::string& type, double err, double tol) {
  auto& table = error_table();
  auto it =
      std::find_if(table.begin(), table.end(), [&](const ErrorRow& r) { return r.kernel == kernel && r.type == type; });
  if (it == table.end()) {
    table.push_back(ErrorRow{kernel, type, err, tol, 0, false});
    it = table.end() - 1;
  } else if (badness(err, tol) > badness(it->err, it->tol)) {
    it->err = err;
    it->tol = tol;
  }
  ++it->checks;
  if (!(err <= tol)) it->failed = true;
}

void print_error_table() {
  const auto& table = error_table();
  if (table.empty()) return;
  std::printf("hzp_kernel_tests: largest error per kernel and type (backend %s)\n", env().backend.c_str());
  for (const ErrorRow& r : table)
    std::printf("kernel %-24s %-10s max rel err %.3g (tol %.3g)%s\n", r.kernel.c_str(), r.type.c_str(), r.err, r.tol,
                r.failed ? "  FAILED" : "");
  std::fflush(stdout);
}

struct ErrorTablePrinter : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats& stats) override {
    print_error_table();
    TestEventListenerBase::testRunEnded(stats);
  }
};
CATCH_REGISTER_LISTENER(ErrorTablePrinter)

std::string tname(ScalarType t) {
  return to_string(t);
}
std::string tname(ScalarType a, ScalarType b) {
  return a == b ? tname(a) : tname(a) + ">" + tname(b);
}

// --- Tolerances --------------------------------------------------------------------------------------------

double base_tol(ScalarType t) {
  switch (t) {
    case ScalarType::kFp32:
      return 1e-5;
    case ScalarType::kBf16:
      return 1e-2;
    case ScalarType::kFp16:
      return 2e-3;
    default:
      return 1e-12;
  }
}

// One ulp of `t` relative to a value (the largest spacing in a binade over its smallest value).
double ulp_rel(ScalarType t) {
  switch (t) {
    case ScalarType::kFp32:
      return 0x1p-23;
    case ScalarType::kBf16:
      return 0x1p-7;
    case ScalarType::kFp16:
      return 0x1p-10;
    default:
      return 0;
  }
}

// Inputs of type `in` (the arithmetic's error), fp32 reductions over n terms (their error grows as sqrt(n)
// past 256 terms), the result stored as `out`.
double tol(ScalarType in, ScalarType out, double n = 1) {
  const double growth = std::max(1.0, std::sqrt(n / 256.0));
  return base_tol(in) + base_tol(kF32) * (growth - 1) + ulp_rel(out);
}

// --- Comparisons --------------------------------------------------------------------------------------------

template <typename G>
double expect_close(const std::string& kernel, const std::string& type, const std::string& what, const G& got,
                    const DVec& ref, double tolerance, double floor = 0) {
  REQUIRE(got.size() == ref.size());
  double scale = floor;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  if (scale == 0 || !std::isfinite(scale)) scale = 1;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double d = std::abs(static_cast<double>(got[i]) - ref[i]);
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    if (d > worst) worst = d, at = i;
  }
  const double err = worst / scale;
  record(kernel, type, err, tolerance);
  if (verbose())
    std::printf("  %-24s %-10s %-56s rel err %.3g (tol %.3g)\n", kernel.c_str(), type.c_str(), what.c_str(), err,
                tolerance);
  INFO(kernel << " " << type << " " << what << ": max rel err " << err << " (tol " << tolerance << ", scale " << scale
              << ") at element " << at << " of " << ref.size() << ": got "
              << (ref.empty() ? 0.0 : static_cast<double>(got[at])) << ", reference " << (ref.empty() ? 0.0 : ref[at]));
  CHECK(err <= tolerance);
  return err;
}

bool same_value(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) ||
         (a == b && std::signbit(a) == std::signbit(b));  // -0 and +0 differ: a cast must keep the sign
}

// Exact equality (copies, permutations, integers); recorded as error 0 or 1 with tolerance 0.
template <typename G, typename W>
void expect_equal(const std::string& kernel, const std::string& type, const std::string& what, const G& got,
                  const W& want) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!same_value(static_cast<double>(got[i]), static_cast<double>(want[i]))) {
      if (bad == 0) first = i;
      ++bad;
    }
  record(kernel, type, bad == 0 ? 0.0 : 1.0, 0.0);
  if (verbose())
    std::printf("  %-24s %-10s %-56s %s\n", kernel.c_str(), type.c_str(), what.c_str(),
                bad == 0 ? "exact" : "MISMATCH");
  INFO(kernel << " " << type << " " << what << ": " << bad << " of " << want.size() << " elements differ; first at "
              << first << ": got " << (bad ? static_cast<double>(got[first]) : 0.0) << ", expected "
              << (bad ? static_cast<double>(want[first]) : 0.0));
  CHECK(bad == 0);
}

// --- Device memory from the host ----------------------------------------------------------------------------

// One test's pool, stream and kernels. Host staging copies live until the next synchronisation, as
// copy_from_host requires.
class Ctx {
 public:
  explicit Ctx(std::int64_t pool_bytes = std::int64_t{64} << 20) {
    Device& device = *env().device;
    pool_ = device.create_pool(pool_bytes);
    REQUIRE(pool_ != nullptr);
    stream_ = device.create_stream("test");
    REQUIRE(stream_ != nullptr);
    kernels_ = device.create_kernels(*stream_);
    REQUIRE(kernels_ != nullptr);
  }
  ~Ctx() {
    if (stream_ != nullptr) static_cast<void>(stream_->synchronize());
  }
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;

  Kernels& k() { return *kernels_; }
  Stream& stream() { return *stream_; }

  Buffer alloc(ScalarType t, std::int64_t n) {
    if (n == 0) return Buffer{nullptr, 0, t};
    Result<Buffer> b = pool_->allocate("test", n, t);
    if (!b.ok()) FAIL("allocate " << n << " " << to_string(t) << ": " << b.status().message());
    return *b;
  }

  void put_bytes(const Buffer& b, const void* src, std::size_t bytes) {
    REQUIRE(bytes == static_cast<std::size_t>(b.bytes()));
    if (bytes == 0) return;
    staging_.emplace_back(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    kernels_->copy_from_host(staging_.back().data(), b);
  }
  void put(const Buffer& b, const Vec& v) {
    REQUIRE(v.size() == sz(b.count));
    REQUIRE(is_floating(b.type));
    std::vector<char> bytes(sz(b.bytes()));
    encode_floats(b.type, v.data(), b.count, bytes.data());
    put_bytes(b, bytes.data(), bytes.size());
  }
  void put_f64(const Buffer& b, const DVec& v) {
    REQUIRE(b.type == kF64);
    put_bytes(b, v.data(), v.size() * sizeof(double));
  }
  void put_i32(const Buffer& b, const I32& v) {
    REQUIRE(b.type == kI32);
    put_bytes(b, v.data(), v.size() * sizeof(std::int32_t));
  }
  void put_i64(const Buffer& b, const I64& v) {
    REQUIRE(b.type == kI64);
    put_bytes(b, v.data(), v.size() * sizeof(std::int64_t));
  }
  Buffer upload(ScalarType t, const Vec& v) {
    Buffer b = alloc(t, static_cast<std::int64_t>(v.size()));
    put(b, v);
    return b;
  }
  Buffer upload_f64(const DVec& v) {
    Buffer b = alloc(kF64, static_cast<std::int64_t>(v.size()));
    put_f64(b, v);
    return b;
  }
  Buffer upload_i32(const I32& v) {
    Buffer b = alloc(kI32, static_cast<std::int64_t>(v.size()));
    put_i32(b, v);
    return b;
  }
  Buffer upload_i64(const I64& v) {
    Buffer b = alloc(kI64, static_cast<std::int64_t>(v.size()));
    put_i64(b, v);
    return b;
  }

  // Waits for the stream; fails the test on a stream failure or a kernel error.
  void sync() {
    const Status s = stream_->synchronize();
    staging_.clear();
    if (!s.ok()) FAIL("stream failed: " << s.message());
    require_ok();
  }
  void require_ok() {
    if (!kernels_->status().ok()) FAIL("kernels (" << kernels_->backend() << "): " << kernels_->status().message());
  }

  std::vector<char> get_bytes(const Buffer& b) {
    std::vector<char> out(sz(b.bytes()));
    if (!out.empty()) kernels_->copy_to_host(b, out.data());
    sync();
    return out;
  }
  Vec get(const Buffer& b) {
    if (b.type == kF64) {
      const DVec d = get_f64(b);
      return Vec(d.begin(), d.end());
    }
    REQUIRE(is_floating(b.type));
    const std::vector<char> bytes = get_bytes(b);
    Vec out(sz(b.count));
    decode_floats(b.type, bytes.data(), b.count, out.data());
    return out;
  }
  DVec get_f64(const Buffer& b) {
    REQUIRE(b.type == kF64);
    const std::vector<char> bytes = get_bytes(b);
    DVec out(sz(b.count));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  I32 get_i32(const Buffer& b) {
    REQUIRE(b.type == kI32);
    const std::vector<char> bytes = get_bytes(b);
    I32 out(sz(b.count));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  I64 get_i64(const Buffer& b) {
    REQUIRE(b.type == kI64);
    const std::vector<char> bytes = get_bytes(b);
    I64 out(sz(b.count));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

 private:
  std::unique_ptr<MemoryPool> pool_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Kernels> kernels_;
  std::vector<std::vector<char>> staging_;  // moving the outer vector keeps each inner buffer in place
};

// --- Host data ---------------------------------------------------------------------------------------------

Vec randn(std::int64_t n, std::mt19937& rng, double stddev = 1.0, double mean = 0.0) {
  std::normal_distribution<double> dist(mean, stddev);
  Vec v(sz(n));
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

Vec rounded(ScalarType t, Vec v) {
  for (float& x : v) x = round_to(t, x);
  return v;
}

// n values of N(mean, stddev^2) as stored in a buffer of type t.
Vec rand_t(ScalarType t, std::int64_t n, std::mt19937& rng, double stddev = 1.0, double mean = 0.0) {
  return rounded(t, randn(n, rng, stddev, mean));
}

DVec to_d(const Vec& v) {
  return DVec(v.begin(), v.end());
}

std::string shape_str(std::initializer_list<std::int64_t> dims) {
  std::string s;
  for (std::int64_t d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

// Central differences of f at x (one coordinate at a time: every one, or those of `coords`) against the analytic
// gradient `grad`, in fp32: the step actually taken, float(x + eps) - float(x - eps), is the divisor.
void check_finite_differences(const std::string& kernel, const std::string& what, const Vec& x, const Vec& grad,
                              const std::function<double(const Vec&)>& f, double eps, double tolerance,
                              const std::vector<std::size_t>& coords = {}) {
  REQUIRE(x.size() == grad.size());
  std::vector<std::size_t> at = coords;
  if (at.empty()) {
    at.resize(x.size());
    std::iota(at.begin(), at.end(), std::size_t{0});
  }
  DVec numeric(at.size());
  Vec analytic(at.size());
  Vec probe = x;
  for (std::size_t n = 0; n < at.size(); ++n) {
    const std::size_t i = at[n];
    REQUIRE(i < x.size());
    const float plus = static_cast<float>(x[i] + eps), minus = static_cast<float>(x[i] - eps);
    probe[i] = plus;
    const double fp = f(probe);
    probe[i] = minus;
    const double fm = f(probe);
    probe[i] = x[i];
    numeric[n] = (fp - fm) / (static_cast<double>(plus) - minus);
    analytic[n] = grad[i];
  }
  const std::string which = coords.empty() ? "" : " on " + std::to_string(at.size()) + " coordinates";
  expect_close(kernel, "fp32-fd", what + which + " vs finite differences", analytic, numeric, tolerance);
}

// The same along a random direction u ~ N(0, 1)^n (two evaluations of f): (f(x + eps u) - f(x - eps u)) / 2 eps
// against <grad, d> / 2 eps, d = float(x + eps u) - float(x - eps u) the step actually taken; the error is
// relative to the directional derivative.
void check_directional_difference(const std::string& kernel, const std::string& what, const Vec& x, const Vec& grad,
                                  const std::function<double(const Vec&)>& f, double eps, double tolerance,
                                  std::mt19937& rng) {
  REQUIRE(x.size() == grad.size());
  const Vec u = randn(static_cast<std::int64_t>(x.size()), rng);
  Vec plus(x.size()), minus(x.size());
  double analytic = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    plus[i] = static_cast<float>(x[i] + eps * u[i]);
    minus[i] = static_cast<float>(x[i] - eps * u[i]);
    analytic += static_cast<double>(grad[i]) * (static_cast<double>(plus[i]) - minus[i]);
  }
  const double numeric = (f(plus) - f(minus)) / (2 * eps);
  expect_close(kernel, "fp32-fd", what + " along a random direction vs finite differences", DVec{analytic / (2 * eps)},
               DVec{numeric}, tolerance);
}

// Both: a random direction, then `count` distinct random coordinates plus those of `forced`.
void check_gradient(const std::string& kernel, const std::string& what, const Vec& x, const Vec& grad,
                    const std::function<double(const Vec&)>& f, double eps, double tolerance, std::mt19937& rng,
                    std::size_t count = 6, const std::vector<std::size_t>& forced = {}) {
  check_directional_difference(kernel, what, x, grad, f, eps, tolerance, rng);
  std::vector<std::size_t> coords = forced;
  std::uniform_int_distribution<std::size_t> pick(0, x.size() - 1);
  for (std::size_t tries = 0; coords.size() < forced.size() + std::min(count, x.size()) && tries < 1000; ++tries) {
    const std::size_t i = pick(rng);
    if (std::find(coords.begin(), coords.end(), i) == coords.end()) coords.push_back(i);
  }
  check_finite_differences(kernel, what, x, grad, f, eps, tolerance, coords);
}

// sum(out * R) in double: the objective of every finite-difference check.
double dot_r(const Vec& out, const Vec& R) {
  REQUIRE(out.size() == R.size());
  double sum = 0;
  for (std::size_t i = 0; i < out.size(); ++i) sum += static_cast<double>(out[i]) * R[i];
  return sum;
}

// after - before in double (what an accumulating kernel added), as fp32.
Vec added(const Vec& after, const Vec& before) {
  REQUIRE(after.size() == before.size());
  Vec d(after.size());
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<float>(static_cast<double>(after[i]) - before[i]);
  return d;
}

// ============================================================================================================
// Memory: fill, copy, cast
// ============================================================================================================

TEST_CASE("kernels fill writes a rounded value into a slice of every type", "[kernels]") {
  Ctx c;
  std::mt19937 rng(101);
  for (ScalarType t : kFloatTypes) {
    for (const double value : {static_cast<double>(1.2345678f), -3.0, 1e5, 0.0}) {
      const std::int64_t n = 37;
      const Vec init = rand_t(t, n, rng);
      const Buffer b = c.upload(t, init);
      c.k().fill(b.slice(5, 19), value);
      const Vec got = c.get(b);
      Vec want = init;
      for (std::int64_t i = 5; i < 24; ++i) want[sz(i)] = round_to(t, static_cast<float>(value));
      expect_equal("fill", tname(t), "value " + std::to_string(value) + " into elements 5..23 of 37", got, want);
    }
  }
  // fp64 keeps the double exactly; integer buffers take integer values.
  const Buffer d = c.upload_f64(DVec(9, 2.0));
  c.k().fill(d.slice(1, 7), 0.1);
  DVec want_d(9, 0.1);
  want_d[0] = want_d[8] = 2.0;
  expect_equal("fill", "fp64", "0.1 exactly", c.get_f64(d), want_d);

  const Buffer i32 = c.upload_i32(I32(11, 7));
  c.k().fill(i32.slice(2, 8), -3.0);
  I32 want32(11, -3);
  want32[0] = want32[1] = want32[10] = 7;
  expect_equal("fill", "int32", "-3 into 2..9", c.get_i32(i32), want32);

  const Buffer i64 = c.upload_i64(I64(5, 1));
  c.k().fill(i64.slice(0, 4), 123456789012.0);
  expect_equal("fill", "int64", "a value past 2^32", c.get_i64(i64),
               I64{123456789012, 123456789012, 123456789012, 123456789012, 1});
  c.require_ok();
}

TEST_CASE("kernels copy moves slices of every type device to device", "[kernels]") {
  Ctx c;
  std::mt19937 rng(102);
  for (ScalarType t : kFloatTypes) {
    const Vec src = rand_t(t, 41, rng), dst0 = rand_t(t, 50, rng);
    const Buffer s = c.upload(t, src), d = c.upload(t, dst0);
    c.k().copy(s.slice(3, 31), d.slice(11, 31));
    Vec want = dst0;
    for (int i = 0; i < 31; ++i) want[sz(11 + i)] = src[sz(3 + i)];
    expect_equal("copy", tname(t), "31 elements, offset 3 -> 11", c.get(d), want);
  }
  I32 a32(17), b32(17, -1);
  std::iota(a32.begin(), a32.end(), 100);
  const Buffer s32 = c.upload_i32(a32), d32 = c.upload_i32(b32);
  c.k().copy(s32.slice(1, 15), d32.slice(0, 15));
  for (int i = 0; i < 15; ++i) b32[sz(i)] = a32[sz(i + 1)];
  expect_equal("copy", "int32", "15 elements", c.get_i32(d32), b32);
  I64 a64(9), b64(9, -7);
  std::iota(a64.begin(), a64.end(), std::int64_t{1} << 40);
  const Buffer s64 = c.upload_i64(a64), d64 = c.upload_i64(b64);
  c.k().copy(s64, d64);
  expect_equal("copy", "int64", "whole buffer", c.get_i64(d64), a64);
  c.require_ok();
}

TEST_CASE("kernels cast converts between every pair of floating types with round to nearest even", "[kernels]") {
  Ctx c;
  std::mt19937 rng(103);
  // Specials: zeros, infinities, NaN, fp16 overflow (65520 -> inf, 65519.996 -> 65504), bf16 / fp16 ties
  // (1 + 2^-8 -> 1 and 1 + 3 * 2^-8 -> 1 + 2^-6 in bf16; 1 + 2^-11 -> 1 and 1 + 3 * 2^-11 -> 1 + 2^-9 in fp16),
  // fp16 subnormal ties (2^-25 -> 0, 3 * 2^-25 -> 2^-23), values past the fp32 range (fp64 sources only).
  const float inf = std::numeric_limits<float>::infinity();
  DVec specials = {0.0,
                   -0.0,
                   inf,
                   -inf,
                   std::numeric_limits<double>::quiet_NaN(),
                   65504.0,
                   65519.99609375,
                   65520.0,
                   -70000.0,
                   1e6,
                   1.0 + 0x1p-8,
                   1.0 + 3 * 0x1p-8,
                   -(1.0 + 0x1p-8),
                   1.0 + 0x1p-11,
                   1.0 + 3 * 0x1p-11,
                   -(1.0 + 3 * 0x1p-11),
                   0x1p-25,
                   3 * 0x1p-25,
                   0x1p-14 - 0x1p-25,
                   0x1p-24,
                   3.0e38,
                   0x1p-130};
  const Vec normal = randn(97, rng, 100.0);
  for (float x : normal) specials.push_back(x);
  const Vec small = randn(33, rng, 1e-5);
  for (float x : small) specials.push_back(x);

  for (ScalarType from : kFloatTypes) {
    for (ScalarType to : kFloatTypes) {
      // The source as stored; fp64 sources also get values past fp32's range.
      DVec src(specials.size());
      for (std::size_t i = 0; i < src.size(); ++i)
        src[i] = from == kF64 ? specials[i] : static_cast<double>(round_to(from, static_cast<float>(specials[i])));
      if (from == kF64) src.push_back(1e300), src.push_back(-1e300), src.push_back(1e-300);
      const std::int64_t count = static_cast<std::int64_t>(src.size());
      Buffer s = c.alloc(from, count), d = c.alloc(to, count);
      if (from == kF64) {
        c.put_f64(s, src);
      } else {
        c.put(s, Vec(src.begin(), src.end()));
      }
      c.k().cast(s, d);
      DVec want(src.size());
      for (std::size_t i = 0; i < src.size(); ++i) {
        const float f = static_cast<float>(src[i]);  // exact for every source here but the +-1e300 / 1e-300
        want[i] = to == kF64 ? src[i] : static_cast<double>(round_to(to, f));
      }
      if (to == kF64) {
        expect_equal("cast", tname(from, to), std::to_string(count) + " values incl. specials", c.get_f64(d), want);
      } else {
        const Vec got = c.get(d);
        expect_equal("cast", tname(from, to), std::to_string(count) + " values incl. specials",
                     DVec(got.begin(), got.end()), want);
      }
    }
  }
  c.require_ok();
}

// ============================================================================================================
// Element-wise, norms, the optimizer
// ============================================================================================================

TEST_CASE("kernels scale multiplies in place on every floating type", "[kernels]") {
  Ctx c;
  std::mt19937 rng(104);
  for (ScalarType t : kFloatTypes) {
    for (std::int64_t n : {1, 67, 1029}) {
      for (float alpha : {-0.3125f, 0.1f, 3.7f}) {
        const Vec x = rand_t(t, n, rng, 3.0);
        const Buffer b = c.upload(t, x);
        c.k().scale(b.slice(0, n - (n > 1 ? 1 : 0)), alpha);  // the last element (n > 1) stays
        DVec ref = to_d(x);
        for (std::int64_t i = 0; i < n - (n > 1 ? 1 : 0); ++i) ref[sz(i)] = static_cast<double>(x[sz(i)]) * alpha;
        if (t == kF64) {
          // fp64 buffers scale in fp64; the source values are floats, so compare in double.
          const DVec got = c.get_f64(b);
          expect_close("scale", tname(t), "n " + std::to_string(n) + " alpha " + std::to_string(alpha), got, ref,
                       1e-12);
        } else {
          expect_close("scale", tname(t), "n " + std::to_string(n) + " alpha " + std::to_string(alpha), c.get(b), ref,
                       tol(kF32, t));
        }
      }
    }
  }
  c.require_ok();
}

TEST_CASE("kernels add accumulates across every pair of tensor types", "[kernels]") {
  Ctx c;
  std::mt19937 rng(105);
  for (ScalarType st : kTensorTypes) {
    for (ScalarType dt : kTensorTypes) {
      for (std::int64_t n : {1, 129, 1001}) {
        const Vec src = rand_t(st, n, rng), dst = rand_t(dt, n, rng, 2.0);
        const Buffer s = c.upload(st, src), d = c.upload(dt, dst);
        c.k().add(s, d);
        DVec ref(sz(n));
        for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<double>(src[i]) + dst[i];
        expect_close("add", tname(st, dt), "n " + std::to_string(n), c.get(d), ref, tol(kF32, dt));
      }
    }
  }
  c.require_ok();
}

TEST_CASE("kernels sum_squares accumulates the sum of squares over replicas in fp64", "[kernels]") {
  Ctx c;
  std::mt19937 rng(106);
  for (ScalarType t : kTensorTypes) {
    for (std::int64_t n : {1, 3, 1000, 100003}) {
      const Vec x1 = rand_t(t, n, rng), x2 = rand_t(t, n, rng, 0.5);
      const Buffer b1 = c.upload(t, x1), b2 = c.upload(t, x2);
      const Buffer acc = c.upload_f64({2.5});
      c.k().sum_squares(b1, 1, acc);
      const DVec after1 = c.get_f64(acc);
      c.k().sum_squares(b2, 4, acc);
      const DVec after2 = c.get_f64(acc);
      double s1 = 0, s2 = 0;
      for (float v : x1) s1 += static_cast<double>(v) * v;
      for (float v : x2) s2 += static_cast<double>(v) * v;
      const std::string what = "n " + std::to_string(n);
      expect_close("sum_squares", tname(t), what + ", 2.5 + sum", after1, DVec{2.5 + s1}, 1e-6);
      expect_close("sum_squares", tname(t), what + ", then + sum / 4 replicas", after2, DVec{2.5 + s1 + s2 / 4}, 1e-6);
    }
  }
  c.require_ok();
}

TEST_CASE("kernels clip_coefficient follows its formula and max_norm <= 0 means no clipping", "[kernels]") {
  Ctx c;
  struct Case {
    float norm_sq;
    double max_norm, inv_loss_scale;
  };
  const Case cases[] = {{16.0f, 1.0, 0.5},       {0.25f, 1.0, 1.0}, {16.0f, 0.0, 0.125}, {16.0f, -1.0, 0.25},
                        {0.0f, 1.0, 1.0 / 1024}, {1e6f, 1.0, 1e-3}, {3.3f, 2.0, 1.0},    {4.0f, 2.0, 1.0}};
  for (const Case& cs : cases) {
    const Buffer norm_sq = c.upload(kF32, {cs.norm_sq});
    const Buffer norm = c.upload_f64({-1.0});
    const Buffer coef = c.upload(kF32, {-1.0f});
    c.k().clip_coefficient(norm_sq, cs.max_norm, cs.inv_loss_scale, norm, coef);
    const double want_norm = std::sqrt(static_cast<double>(cs.norm_sq)) * cs.inv_loss_scale;
    const double want_coef =
        cs.max_norm <= 0 ? cs.inv_loss_scale : std::min(1.0, cs.max_norm / (want_norm + 1e-6)) * cs.inv_loss_scale;
    const std::string what = "norm_sq " + std::to_string(cs.norm_sq) + " max_norm " + std::to_string(cs.max_norm) +
                             " inv_loss_scale " + std::to_string(cs.inv_loss_scale);
    expect_close("clip_coefficient", "fp64", what + ": norm", c.get_f64(norm), DVec{want_norm}, 1e-6);
    expect_close("clip_coefficient", "fp32", what + ": coef", c.get(coef), DVec{want_coef}, 1e-6);
  }
  // An infinite norm clips everything away (coef 0), the norm says inf.
  const Buffer norm_sq = c.upload(kF32, {std::numeric_limits<float>::infinity()});
  const Buffer norm = c.upload_f64({0.0});
  const Buffer coef = c.upload(kF32, {1.0f});
  c.k().clip_coefficient(norm_sq, 1.0, 0.5, norm, coef);
  CHECK(std::isinf(c.get_f64(norm)[0]));
  CHECK(c.get(coef)[0] == 0.0f);
  c.require_ok();
}

// One AdamW tensor on the host: the state before a step, as stored.
struct HostAdam {
  ScalarType ptype, gtype;
  bool has_master, decay;
  Vec param, master, m, v;  // master empty when the fp32 param is its own master
};

// The reference step, from the state as stored (fp32 m, v, master), in double.
void reference_adamw(const AdamWHyper& h, float coef, const HostAdam& before, const Vec& grad, DVec& param, DVec& m,
                     DVec& v) {
  const std::size_t n = before.param.size();
  param.assign(n, 0), m.assign(n, 0), v.assign(n, 0);
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(grad[i]) * coef;
    m[i] = h.beta1 * before.m[i] + (1 - h.beta1) * g;
    v[i] = h.beta2 * before.v[i] + (1 - h.beta2) * g * g;
    const double w = before.has_master ? before.master[i] : before.param[i];
    double w_new = w - h.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + h.eps);
    if (before.decay) w_new -= h.lr * h.weight_decay * w;
    param[i] = w_new;
  }
}

TEST_CASE("kernels adamw updates a multi-tensor list with bias correction and skips non-finite steps", "[kernels]") {
  Ctx c;
  std::mt19937 rng(107);
  struct Spec {
    ScalarType ptype, gtype;
    bool master, decay;
    std::int64_t n;
  };
  const Spec specs[] = {{kF32, kF32, false, true, 1},  {kF32, kBf16, false, false, 67}, {kBf16, kBf16, true, true, 129},
                        {kF16, kF16, true, false, 33}, {kBf16, kF32, true, true, 1001}, {kF16, kF32, true, true, 17},
                        {kF32, kF16, false, true, 255}};
  std::vector<HostAdam> host;
  std::vector<AdamWTensor> tensors;
  for (const Spec& s : specs) {
    HostAdam h{s.ptype, s.gtype, s.master, s.decay, {}, {}, Vec(sz(s.n), 0.0f), Vec(sz(s.n), 0.0f)};
    const Vec w = randn(s.n, rng);
    h.param = rounded(s.ptype, w);
    if (s.master) h.master = w;
    AdamWTensor t;
    t.param = c.upload(s.ptype, h.param);
    if (s.master) t.master = c.upload(kF32, h.master);
    t.grad = c.alloc(s.gtype, s.n);
    t.m = c.upload(kF32, h.m);
    t.v = c.upload(kF32, h.v);
    t.decay = s.decay;
    host.push_back(std::move(h));
    tensors.push_back(t);
  }
  const float coef_value = 0.37f;
  AdamWHyper hyper;
  hyper.lr = 1e-2;
  hyper.beta1 = 0.9;
  hyper.beta2 = 0.95;
  hyper.eps = 1e-8;
  hyper.weight_decay = 0.1;
  hyper.coef = c.upload(kF32, {coef_value});
  const Buffer skip = c.upload_f64({0.0});

  auto download = [&](std::size_t i) {
    HostAdam h = host[i];
    h.param = c.get(tensors[i].param);
    if (h.has_master) h.master = c.get(tensors[i].master);
    h.m = c.get(tensors[i].m);
    h.v = c.get(tensors[i].v);
    return h;
  };
  auto label = [&](std::size_t i) { return tname(host[i].ptype) + (host[i].has_master ? "+m" : ""); };

  // Steps 1..3 (no skip buffer), then step 4 with a finite skip value: each checked from the state before it.
  for (std::int64_t step = 1; step <= 4; ++step) {
    std::vector<Vec> grads;
    for (std::size_t i = 0; i < host.size(); ++i) {
      grads.push_back(rand_t(host[i].gtype, static_cast<std::int64_t>(host[i].param.size()), rng, 0.5));
      c.put(tensors[i].grad, grads.back());
    }
    hyper.step = step;
    hyper.skip_if_nonfinite = step == 4 ? skip : Buffer{};
    if (step == 4) c.put_f64(skip, {12.5});
    c.k().adamw(hyper, tensors);
    c.sync();
    for (std::size_t i = 0; i < host.size(); ++i) {
      const HostAdam& before = host[i];
      const HostAdam after = download(i);
      DVec w, m, v;
      reference_adamw(hyper, coef_value, before, grads[i], w, m, v);
      const std::string what = "tensor " + std::to_string(i) + " (n " + std::to_string(before.param.size()) +
                               (before.decay ? ", decay" : ", no decay") + ") step " + std::to_string(step);
      expect_close("adamw", label(i), what + ": m", after.m, m, tol(kF32, kF32));
      expect_close("adamw", label(i), what + ": v", after.v, v, tol(kF32, kF32));
      // The fp32 weight's change against the reference change (the update itself, not swamped by w), and
      // the stored 16-bit param as the rounding of the new weight.
      const Vec& w_before = before.has_master ? before.master : before.param;
      const Vec& w_after = after.has_master ? after.master : after.param;
      DVec delta_ref(w.size());
      Vec delta_got(w.size());
      for (std::size_t j = 0; j < w.size(); ++j) {
        delta_ref[j] = w[j] - w_before[j];
        delta_got[j] = static_cast<float>(static_cast<double>(w_after[j]) - w_before[j]);
      }
      expect_close("adamw", label(i), what + ": weight change", delta_got, delta_ref, 1e-4);
      expect_close("adamw", label(i), what + ": weight", w_after, w, tol(kF32, kF32));
      if (before.has_master) expect_close("adamw", label(i), what + ": param", after.param, w, tol(kF32, before.ptype));
      host[i] = after;
    }
  }

  // Inf / NaN in skip_if_nonfinite: nothing changes, bit for bit.
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    for (std::size_t i = 0; i < host.size(); ++i)
      c.put(tensors[i].grad, rand_t(host[i].gtype, static_cast<std::int64_t>(host[i].param.size()), rng));
    c.put_f64(skip, {bad});
    hyper.step = 5;
    hyper.skip_if_nonfinite = skip;
    c.k().adamw(hyper, tensors);
    c.sync();
    for (std::size_t i = 0; i < host.size(); ++i) {
      const HostAdam after = download(i);
      const std::string what = "tensor " + std::to_string(i) + " with skip_if_nonfinite " + std::to_string(bad);
      expect_equal("adamw", label(i), what + ": param unchanged", after.param, host[i].param);
      if (host[i].has_master)
        expect_equal("adamw", label(i), what + ": master unchanged", after.master, host[i].master);
      expect_equal("adamw", label(i), what + ": m unchanged", after.m, host[i].m);
      expect_equal("adamw", label(i), what + ": v unchanged", after.v, host[i].v);
    }
  }
  c.require_ok();
}

// ============================================================================================================
// Matmuls
// ============================================================================================================

// C = alpha op(A) op(B) + beta C on strided, batched, gapped storage; the whole C buffer is compared (what
// lies between rows and between batch items must stay).
void run_matmul(Ctx& c, std::mt19937& rng, ScalarType t, ScalarType ct, bool ta, bool tb, float alpha, float beta,
                std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, std::int64_t gap) {
  const std::int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  const std::int64_t lda = ac + gap, ldb = bc + gap, ldc = n + gap;
  const std::int64_t sa = batch > 1 ? ar * lda + 5 : 0, sb = batch > 1 ? br * ldb + 3 : 0,
                     sc = batch > 1 ? m * ldc + 7 : 0;
  const std::int64_t na = (batch - 1) * sa + ar * lda, nb = (batch - 1) * sb + br * ldb,
                     nc = (batch - 1) * sc + m * ldc + 2;
  const Vec A = rand_t(t, na, rng), B = rand_t(t, nb, rng), C0 = rand_t(ct, nc, rng);
  MatmulArgs args;
  args.trans_a = ta, args.trans_b = tb;
  args.m = m, args.n = n, args.k = k;
  args.alpha = alpha, args.beta = beta;
  args.a = c.upload(t, A), args.b = c.upload(t, B), args.c = c.upload(ct, C0);
  args.lda = lda, args.ldb = ldb, args.ldc = ldc;
  args.batch = batch;
  args.stride_a = sa, args.stride_b = sb, args.stride_c = sc;
  c.k().matmul(args);
  const Vec got = c.get(args.c);
  DVec ref = to_d(C0);
  for (std::int64_t bi = 0; bi < batch; ++bi)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double a = ta ? A[sz(bi * sa + p * lda + i)] : A[sz(bi * sa + i * lda + p)];
          const double b = tb ? B[sz(bi * sb + j * ldb + p)] : B[sz(bi * sb + p * ldb + j)];
          s += a * b;
        }
        const std::size_t at = sz(bi * sc + i * ldc + j);
        ref[at] = alpha * s + beta * static_cast<double>(C0[at]);
      }
  const std::string what = std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " m,n,k " + shape_str({m, n, k}) +
                           " batch " + std::to_string(batch) + " gap " + std::to_string(gap) + " alpha " +
                           std::to_string(alpha) + " beta " + std::to_string(beta);
  expect_close("matmul", tname(t, ct), what, got, ref, tol(t, ct, static_cast<double>(k)));
}

TEST_CASE("kernels matmul in every transpose combination with alpha, beta, strides and batches", "[kernels]") {
  std::mt19937 rng(201);
  struct Shape {
    std::int64_t m, n, k, batch, gap;
  };
  const Shape shapes[] = {{17, 33, 67, 1, 0}, {1, 3, 129, 1, 3}, {33, 17, 5, 3, 2}, {3, 1, 1, 1, 0}, {67, 9, 17, 3, 0}};
  for (ScalarType t : kTensorTypes) {
    for (ScalarType ct : {t, kF32}) {
      if (t == kF32 && ct != t) continue;
      Ctx c;
      for (int trans = 0; trans < 4; ++trans)
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.75f, 1.0f}})
          for (const Shape& s : shapes)
            run_matmul(c, rng, t, ct, (trans & 1) != 0, (trans & 2) != 0, alpha, beta, s.m, s.n, s.k, s.batch, s.gap);
      c.require_ok();
    }
  }
}

TEST_CASE("kernels linear, linear_dx and linear_dw are the model's matmuls", "[kernels]") {
  std::mt19937 rng(202);
  struct Shape {
    std::int64_t m, k, n;
  };
  for (ScalarType t : kTensorTypes) {
    Ctx c;
    for (const Shape& s : {Shape{33, 17, 67}, Shape{1, 129, 3}, Shape{5, 1, 9}}) {
      const std::string dims = "m,k,n " + shape_str({s.m, s.k, s.n});
      const Vec x = rand_t(t, s.m * s.k, rng), w = rand_t(t, s.k * s.n, rng), dy = rand_t(t, s.m * s.n, rng);
      const Buffer bx = c.upload(t, x), bw = c.upload(t, w), bdy = c.upload(t, dy);
      for (bool acc : {false, true}) {
        // y = x W (+ y0)
        const Vec y0 = rand_t(t, s.m * s.n, rng);
        const Buffer y = c.upload(t, y0);
        c.k().linear(bx, bw, y, s.m, s.k, s.n, acc);
        DVec ref(sz(s.m * s.n));
        for (std::int64_t i = 0; i < s.m; ++i)
          for (std::int64_t j = 0; j < s.n; ++j) {
            double sum = acc ? y0[sz(i * s.n + j)] : 0.0;
            for (std::int64_t p = 0; p < s.k; ++p) sum += static_cast<double>(x[sz(i * s.k + p)]) * w[sz(p * s.n + j)];
            ref[sz(i * s.n + j)] = sum;
          }
        expect_close("linear", tname(t), dims + (acc ? " accumulate" : ""), c.get(y), ref, tol(t, t, s.k));
        // dx = dy W^T (+ dx0)
        const Vec dx0 = rand_t(t, s.m * s.k, rng);
        const Buffer dx = c.upload(t, dx0);
        c.k().linear_dx(bdy, bw, dx, s.m, s.k, s.n, acc);
        DVec rdx(sz(s.m * s.k));
        for (std::int64_t i = 0; i < s.m; ++i)
          for (std::int64_t p = 0; p < s.k; ++p) {
            double sum = acc ? dx0[sz(i * s.k + p)] : 0.0;
            for (std::int64_t j = 0; j < s.n; ++j) sum += static_cast<double>(dy[sz(i * s.n + j)]) * w[sz(p * s.n + j)];
            rdx[sz(i * s.k + p)] = sum;
          }
        expect_close("linear_dx", tname(t), dims + (acc ? " accumulate" : ""), c.get(dx), rdx, tol(t, t, s.n));
      }
      // dW += x^T dy, into a gradient of the same type or fp32.
      for (ScalarType wt : {t, kF32}) {
        const Vec dw0 = rand_t(wt, s.k * s.n, rng);
        const Buffer dw = c.upload(wt, dw0);
        c.k().linear_dw(bx, bdy, dw, s.m, s.k, s.n);
        DVec ref(sz(s.k * s.n));
        for (std::int64_t p = 0; p < s.k; ++p)
          for (std::int64_t j = 0; j < s.n; ++j) {
            double sum = dw0[sz(p * s.n + j)];
            for (std::int64_t i = 0; i < s.m; ++i) sum += static_cast<double>(x[sz(i * s.k + p)]) * dy[sz(i * s.n + j)];
            ref[sz(p * s.n + j)] = sum;
          }
        expect_close("linear_dw", tname(t, wt), dims, c.get(dw), ref, tol(t, wt, s.m));
        if (t == kF32) break;
      }
    }
    c.require_ok();
  }
}

TEST_CASE("kernels linear_dx and linear_dw match finite differences of the sum of y times R in fp32", "[kernels]") {
  std::mt19937 rng(203);
  Ctx c;
  const std::int64_t m = 3, k = 4, n = 5;
  const Vec x = randn(m * k, rng), w = randn(k * n, rng), R = randn(m * n, rng);
  const Buffer bx = c.upload(kF32, x), bw = c.upload(kF32, w), bR = c.upload(kF32, R);
  const Buffer px = c.alloc(kF32, m * k), pw = c.alloc(kF32, k * n), py = c.alloc(kF32, m * n);
  // L(x, W) = sum(linear(x, W) * R), each evaluation a forward on the device.
  auto objective = [&](const Vec& x2, const Vec& w2) {
    c.put(px, x2), c.put(pw, w2);
    c.k().linear(px, pw, py, m, k, n);
    return dot_r(c.get(py), R);
  };
  const std::string dims = "m,k,n " + shape_str({m, k, n});
  for (bool acc : {false, true}) {
    const Vec dx0 = randn(m * k, rng);
    const Buffer dx = c.upload(kF32, dx0);
    c.k().linear_dx(bR, bw, dx, m, k, n, acc);
    const Vec gx = acc ? added(c.get(dx), dx0) : c.get(dx);
    check_gradient(
        "linear_dx", dims + (acc ? " accumulate" : "") + ": dx", x, gx, [&](const Vec& v) { return objective(v, w); },
        0.1, 2e-5, rng);
  }
  const Vec dw0 = randn(k * n, rng, 0.5);
  const Buffer dw = c.upload(kF32, dw0);
  c.k().linear_dw(bx, bR, dw, m, k, n);
  check_gradient(
      "linear_dw", dims + ": dW (accumulated)", w, added(c.get(dw), dw0), [&](const Vec& v) { return objective(x, v); },
      0.1, 2e-5, rng);
  c.require_ok();
}

// C = alpha op(A) op(B) on dense storage (ld = the stored row length).
void dense_matmul(Kernels& k, const Buffer& a, bool ta, const Buffer& b, bool tb, const Buffer& out, std::int64_t m,
                  std::int64_t n, std::int64_t kk, float alpha) {
  MatmulArgs args;
  args.trans_a = ta, args.trans_b = tb;
  args.m = m, args.n = n, args.k = kk;
  args.alpha = alpha;
  args.a = a, args.b = b, args.c = out;
  args.lda = ta ? m : kk, args.ldb = tb ? kk : n, args.ldc = n;
  k.matmul(args);
}

TEST_CASE("kernels matmul is its own backward in every transpose combination: finite differences in fp32",
          "[kernels]") {
  std::mt19937 rng(204);
  Ctx c;
  const std::int64_t m = 3, n = 4, k = 5;
  const float alpha = 0.75f;
  for (int trans = 0; trans < 4; ++trans) {
    const bool ta = (trans & 1) != 0, tb = (trans & 2) != 0;
    // A is stored [k x m] when transposed, B [n x k].
    const Vec A = randn(m * k, rng), B = randn(k * n, rng), R = randn(m * n, rng);
    const Buffer ba = c.upload(kF32, A), bb = c.upload(kF32, B), bR = c.upload(kF32, R);
    const Buffer da = c.alloc(kF32, m * k), db = c.alloc(kF32, k * n);
    // dL/d op(A) = alpha R op(B)^T, dL/d op(B) = alpha op(A)^T R, each stored as its operand is.
    if (ta) {
      dense_matmul(c.k(), bb, tb, bR, true, da, k, m, n, alpha);  // dA = alpha op(B) R^T
    } else {
      dense_matmul(c.k(), bR, false, bb, !tb, da, m, k, n, alpha);  // dA = alpha R op(B)^T
    }
    if (tb) {
      dense_matmul(c.k(), bR, true, ba, ta, db, n, k, m, alpha);  // dB = alpha R^T op(A)
    } else {
      dense_matmul(c.k(), ba, !ta, bR, false, db, k, n, m, alpha);  // dB = alpha op(A)^T R
    }
    const Vec ga = c.get(da), gb = c.get(db);
    const Buffer pa = c.alloc(kF32, m * k), pb = c.alloc(kF32, k * n), pc = c.alloc(kF32, m * n);
    auto objective = [&](const Vec& a2, const Vec& b2) {
      c.put(pa, a2), c.put(pb, b2);
      dense_matmul(c.k(), pa, ta, pb, tb, pc, m, n, k, alpha);
      return dot_r(c.get(pc), R);
    };
    const std::string what = std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " m,n,k " + shape_str({m, n, k}) +
                             " alpha " + std::to_string(alpha);
    check_gradient(
        "matmul", what + ": dA", A, ga, [&](const Vec& v) { return objective(v, B); }, 0.1, 1e-4, rng);
    check_gradient(
        "matmul", what + ": dB", B, gb, [&](const Vec& v) { return objective(A, v); }, 0.1, 1e-4, rng);
  }
  c.require_ok();
}

// ============================================================================================================
// Embedding, RMSNorm, rotary, SwiGLU, softmax
// ============================================================================================================

TEST_CASE("kernels embedding forward gathers rows and backward accumulates repeated ids", "[kernels]") {
  std::mt19937 rng(301);
  const std::int64_t vocab = 50, tokens = 37;
  I32 ids(sz(tokens));
  std::uniform_int_distribution<int> few(0, 4), any(0, static_cast<int>(vocab) - 1);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i % 2 == 0 ? few(rng) : any(rng);  // many repeats
  ids[0] = 0, ids[1] = static_cast<std::int32_t>(vocab - 1);
  for (ScalarType t : kTensorTypes) {
    Ctx c;
    const Buffer bids = c.upload_i32(ids);
    for (std::int64_t hidden : {1, 19, 67}) {
      const Vec table = rand_t(t, vocab * hidden, rng);
      const Buffer bt = c.upload(t, table);
      const Vec out0 = rand_t(t, tokens * hidden + 3, rng);
      const Buffer out = c.upload(t, out0);
      c.k().embedding_forward(bt, bids, out, hidden);
      Vec want = out0;
      for (std::int64_t i = 0; i < tokens; ++i)
        for (std::int64_t j = 0; j < hidden; ++j) want[sz(i * hidden + j)] = table[sz(ids[sz(i)] * hidden + j)];
      expect_equal("embedding_forward", tname(t), "hidden " + std::to_string(hidden), c.get(out), want);

      for (ScalarType gt : {t, kF32}) {
        const Vec dout = rand_t(t, tokens * hidden, rng);
        const Vec dtable0 = rand_t(gt, vocab * hidden, rng, 0.5);
        const Buffer bdout = c.upload(t, dout), bdt = c.upload(gt, dtable0);
        c.k().embedding_backward(bdout, bids, bdt, hidden);
        DVec ref = to_d(dtable0);
        for (std::int64_t i = 0; i < tokens; ++i)
          for (std::int64_t j = 0; j < hidden; ++j) ref[sz(ids[sz(i)] * hidden + j)] += dout[sz(i * hidden + j)];
        expect_close("embedding_backward", tname(t, gt), "hidden " + std::to_string(hidden) + ", repeated ids",
                     c.get(bdt), ref, tol(t, gt, 20));
        if (t == kF32) break;
      }
    }
    c.require_ok();
  }
}

TEST_CASE("kernels embedding backward matches finite differences of the sum of out times R in fp32", "[kernels]") {
  std::mt19937 rng(306);
  Ctx c;
  const std::int64_t vocab = 7, hidden = 3;
  const I32 ids = {3, 0, 3, 5, 3, 1, 0, 6, 3};  // id 3 four times, 0 twice; 2 and 4 unused
  const std::int64_t tokens = static_cast<std::int64_t>(ids.size());
  const Vec table = randn(vocab * hidden, rng), R = randn(tokens * hidden, rng), dtable0 = randn(vocab * hidden, rng);
  const Buffer bids = c.upload_i32(ids), bR = c.upload(kF32, R), bdt = c.upload(kF32, dtable0);
  c.k().embedding_backward(bR, bids, bdt, hidden);
  const Vec grad = added(c.get(bdt), dtable0);
  const Buffer pt = c.alloc(kF32, vocab * hidden), out = c.alloc(kF32, tokens * hidden);
  auto objective = [&](const Vec& t2) {
    c.put(pt, t2);
    c.k().embedding_forward(pt, bids, out, hidden);
    return dot_r(c.get(out), R);
  };
  // Coordinates of the id seen four times, of one seen twice and of an unused one (gradient 0).
  const std::size_t h = sz(hidden);
  check_gradient("embedding_backward", "vocab,hidden,tokens 7x3x9 repeated ids: dtable (accumulated)", table, grad,
                 objective, 0.1, 1e-5, rng, 4, {3 * h + 1, 0 * h + 2, 2 * h + 0});
  c.require_ok();
}

TEST_CASE("kernels rmsnorm forward and backward with accumulation", "[kernels]") {
  std::mt19937 rng(302);
  const double eps = Kernels::kNormEps;
  struct Shape {
    std::int64_t rows, h;
  };
  for (ScalarType t : kTensorTypes) {
    Ctx c;
    for (const Shape& s : {Shape{1, 129}, Shape{3, 5}, Shape{17, 67}, Shape{33, 33}, Shape{2, 2}}) {
      const std::string dims = "rows,h " + shape_str({s.rows, s.h});
      const std::int64_t n = s.rows * s.h;
      const Vec x = rand_t(t, n, rng, 1.5, 0.2), w = rand_t(t, s.h, rng, 0.2, 1.0), dy = rand_t(t, n, rng);
      const Buffer bx = c.upload(t, x), bw = c.upload(t, w), bdy = c.upload(t, dy);
      const Buffer y = c.alloc(t, n), rstd = c.upload(kF32, Vec(sz(s.rows), -1.0f));
      c.k().rmsnorm_forward(bx, bw, y, rstd, s.rows, s.h);
      DVec ry(sz(n)), rr(sz(s.rows));
      for (std::int64_t r = 0; r < s.rows; ++r) {
        double ms = 0;
        for (std::int64_t i = 0; i < s.h; ++i) ms += static_cast<double>(x[sz(r * s.h + i)]) * x[sz(r * s.h + i)];
        rr[sz(r)] = 1.0 / std::sqrt(ms / static_cast<double>(s.h) + eps);
        for (std::int64_t i = 0; i < s.h; ++i) ry[sz(r * s.h + i)] = x[sz(r * s.h + i)] * rr[sz(r)] * w[sz(i)];
      }
      expect_close("rmsnorm_forward", tname(t), dims + ": y", c.get(y), ry, tol(t, t, s.h));
      expect_close("rmsnorm_forward", tname(t, kF32), dims + ": rstd", c.get(rstd), rr, tol(t, kF32, s.h));

      // dL/dx_i = r (dy_i w_i) - r^3 / h x_i sum_j dy_j w_j x_j;  dL/dw_i = sum_rows dy_i x_i r.
      DVec rdx(sz(n)), rdw(sz(s.h), 0.0);
      for (std::int64_t r = 0; r < s.rows; ++r) {
        const double q = rr[sz(r)];
        double dot = 0;
        for (std::int64_t i = 0; i < s.h; ++i) {
          const std::size_t at = sz(r * s.h + i);
          dot += static_cast<double>(dy[at]) * w[sz(i)] * x[at];
          rdw[sz(i)] += static_cast<double>(dy[at]) * x[at] * q;
        }
        for (std::int64_t i = 0; i < s.h; ++i) {
          const std::size_t at = sz(r * s.h + i);
          rdx[at] = q * dy[at] * w[sz(i)] - q * q * q / static_cast<double>(s.h) * x[at] * dot;
        }
      }
      for (bool acc : {false, true}) {
        for (ScalarType wt : {t, kF32}) {
          const Vec dx0 = rand_t(t, n, rng), dw0 = rand_t(wt, s.h, rng, 0.5);
          const Buffer dx = c.upload(t, dx0), dw = c.upload(wt, dw0);
          c.k().rmsnorm_backward(bx, bw, rstd, bdy, dx, dw, s.rows, s.h, acc);
          DVec want_dx = rdx, want_dw = rdw;
          for (std::size_t i = 0; i < want_dx.size(); ++i) want_dx[i] += acc ? dx0[i] : 0.0;
          for (std::size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += dw0[i];
          const std::string what = dims + (acc ? " accumulate" : "");
          expect_close("rmsnorm_backward", tname(t), what + ": dx", c.get(dx), want_dx, tol(t, t, s.h) * 2);
          expect_close("rmsnorm_backward", tname(t, wt), what + ": dw (accumulates)", c.get(dw), want_dw,
                       tol(t, wt, s.rows));
          if (t == kF32) break;
        }
      }
    }
    c.require_ok();
  }
}

TEST_CASE("kernels rmsnorm backward matches finite differences of the sum of y times R in fp32", "[kernels]") {
  std::mt19937 rng(307);
  Ctx c;
  const std::int64_t rows = 3, h = 7, n = rows * h;
  const Vec x = randn(n, rng, 1.5, 0.2), w = randn(h, rng, 0.2, 1.0), R = randn(n, rng);
  const Buffer bx = c.upload(kF32, x), bw = c.upload(kF32, w), bR = c.upload(kF32, R);
  const Buffer y = c.alloc(kF32, n), rstd = c.alloc(kF32, rows);
  c.k().rmsnorm_forward(bx, bw, y, rstd, rows, h);
  // Each evaluation a forward on buffers of its own (rstd stays the base point's, for the backward).
  const Buffer px = c.alloc(kF32, n), pw = c.alloc(kF32, h), py = c.alloc(kF32, n), prstd = c.alloc(kF32, rows);
  auto objective = [&](const Vec& x2, const Vec& w2) {
    c.put(px, x2), c.put(pw, w2);
    c.k().rmsnorm_forward(px, pw, py, prstd, rows, h);
    return dot_r(c.get(py), R);
  };
  for (bool acc : {false, true}) {
    const Vec dx0 = randn(n, rng), dw0 = randn(h, rng, 0.5);
    const Buffer dx = c.upload(kF32, dx0), dw = c.upload(kF32, dw0);
    c.k().rmsnorm_backward(bx, bw, rstd, bR, dx, dw, rows, h, acc);
    const Vec gx = acc ? added(c.get(dx), dx0) : c.get(dx), gw = added(c.get(dw), dw0);
    const std::string what = "rows,h " + shape_str({rows, h}) + (acc ? " accumulate" : "");
    check_gradient(
        "rmsnorm_backward", what + ": dx", x, gx, [&](const Vec& v) { return objective(v, w); }, 1e-2, 3e-4, rng);
    check_gradient(
        "rmsnorm_backward", what + ": dw (accumulated)", w, gw, [&](const Vec& v) { return objective(x, v); }, 1e-2,
        3e-4, rng);
  }
  c.require_ok();
}

// cos/sin [seq x d/2] in double: angle(t, i) = t * 10000^(-2i/d).
void reference_rope_tables(std::int64_t seq, std::int64_t d, DVec& cos_t, DVec& sin_t) {
  cos_t.assign(sz(seq * (d / 2)), 0), sin_t.assign(sz(seq * (d / 2)), 0);
  for (std::int64_t t = 0; t < seq; ++t)
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const double angle =
          static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      cos_t[sz(t * (d / 2) + i)] = std::cos(angle);
      sin_t[sz(t * (d / 2) + i)] = std::sin(angle);
    }
}

// The rotation (inverse: its transpose) of x [rows x heads*d] with the given fp32 tables, in double.
DVec reference_rope(const Vec& x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                    const Vec& cos_t, const Vec& sin_t, bool inverse) {
  DVec y = to_d(x);
  const std::int64_t half = d / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t pos = r % seq;
    for (std::int64_t hd = 0; hd < heads; ++hd)
      for (std::int64_t i = 0; i < half; ++i) {
        const std::size_t a = sz(r * heads * d + hd * d + i), b = a + sz(half);
        const double cs = cos_t[sz(pos * half + i)],
                     sn = inverse ? -sin_t[sz(pos * half + i)] : sin_t[sz(pos * half + i)];
        y[a] = x[a] * cs - x[b] * sn;
        y[b] = x[b] * cs + x[a] * sn;
      }
  }
  return y;
}

TEST_CASE("kernels rope tables, forward rotation and backward inverse", "[kernels]") {
  std::mt19937 rng(303);
  {
    Ctx c;
    for (std::int64_t seq : {1, 13, 67})
      for (std::int64_t d : {2, 6, 10, 64}) {
        const Buffer cs = c.alloc(kF32, seq * d / 2 + 1), sn = c.alloc(kF32, seq * d / 2 + 1);
        c.k().rope_tables(cs, sn, seq, d);
        DVec rc, rs;
        reference_rope_tables(seq, d, rc, rs);
        Vec gc = c.get(cs), gs = c.get(sn);
        CHECK(gc.back() == 0.0f);  // nothing past seq x d/2
        CHECK(gs.back() == 0.0f);
        gc.pop_back(), gs.pop_back();
        const std::string what = "seq,d " + shape_str({seq, d});
        // fp32 angles up to seq: an absolute error of ~seq * 2^-24 is the table's own rounding.
        const double table_tol = 1e-5 * std::max(1.0, static_cast<double>(seq) / 32.0);
        expect_close("rope_tables", "fp32", what + ": cos", gc, rc, table_tol, 1.0);
        expect_close("rope_tables", "fp32", what + ": sin", gs, rs, table_tol, 1.0);
      }
    c.require_ok();
  }
  struct Shape {
    std::int64_t rows, seq, heads, d;
  };
  for (ScalarType t : kTensorTypes) {
    Ctx c;
    for (const Shape& s : {Shape{26, 13, 3, 6}, Shape{7, 13, 5, 10}, Shape{39, 13, 1, 2}, Shape{37, 37, 2, 64}}) {
      const std::string dims = "rows,seq,heads,d " + shape_str({s.rows, s.seq, s.heads, s.d});
      DVec rc, rs;
      reference_rope_tables(s.seq, s.d, rc, rs);
      const Vec tc(rc.begin(), rc.end()), ts(rs.begin(), rs.end());  // the tables as fp32
      const Buffer cs = c.upload(kF32, tc), sn = c.upload(kF32, ts);
      const std::int64_t n = s.rows * s.heads * s.d;
      const Vec x = rand_t(t, n, rng);
      const Buffer bx = c.upload(t, x);
      c.k().rope_forward(bx, s.rows, s.seq, s.heads, s.d, cs, sn);
      const Vec y = c.get(bx);
      expect_close("rope_forward", tname(t), dims, y, reference_rope(x, s.rows, s.seq, s.heads, s.d, tc, ts, false),
                   tol(t, t));
      // Backward of the rotated values is the inverse rotation; it brings y back to x.
      c.k().rope_backward(bx, s.rows, s.seq, s.heads, s.d, cs, sn);
      expect_close("rope_backward", tname(t), dims + ": backward(forward(x)) = x", c.get(bx), to_d(x), 2 * tol(t, t));
      const Vec g = rand_t(t, n, rng);
      const Buffer bg = c.upload(t, g);
      c.k().rope_backward(bg, s.rows, s.seq, s.heads, s.d, cs, sn);
      expect_close("rope_backward", tname(t), dims + ": inverse rotation", c.get(bg),
                   reference_rope(g, s.rows, s.seq, s.heads, s.d, tc, ts, true), tol(t, t));
    }
    // With the backend's own tables.
    const std::int64_t seq = 13, d = 10, heads = 3, rows = 26;
    const Buffer cs = c.alloc(kF32, seq * d / 2), sn = c.alloc(kF32, seq * d / 2);
    c.k().rope_tables(cs, sn, seq, d);
    const Vec tc = c.get(cs), ts = c.get(sn);
    const Vec x = rand_t(t, rows * heads * d, rng);
    const Buffer bx = c.upload(t, x);
    c.k().rope_forward(bx, rows, seq, heads, d, cs, sn);
    expect_close("rope_forward", tname(t), "with the backend's tables", c.get(bx),
                 reference_rope(x, rows, seq, heads, d, tc, ts, false), tol(t, t));
    c.require_ok();
  }
}

TEST_CASE("kernels rope backward is the transpose of the forward rotation: finite differences in fp32", "[kernels]") {
  std::mt19937 rng(308);
  Ctx c;
  const std::int64_t rows = 10, seq = 5, heads = 2, d = 6, n = rows * heads * d;  // two sequences
  const Buffer cs = c.alloc(kF32, seq * d / 2), sn = c.alloc(kF32, seq * d / 2);
  c.k().rope_tables(cs, sn, seq, d);
  const Vec x = randn(n, rng), R = randn(n, rng);
  // d<R, rope_forward(x)>/dx = rope_backward(R).
  const Buffer bg = c.upload(kF32, R);
  c.k().rope_backward(bg, rows, seq, heads, d, cs, sn);
  const Vec grad = c.get(bg);
  const Buffer px = c.alloc(kF32, n);
  auto objective = [&](const Vec& v) {
    c.put(px, v);
    c.k().rope_forward(px, rows, seq, heads, d, cs, sn);
    return dot_r(c.get(px), R);
  };
  check_gradient("rope_backward", "rows,seq,heads,d " + shape_str({rows, seq, heads, d}) + ": <R, rope_forward(x)>", x,
                 grad, objective, 0.1, 1e-5, rng, 8);
  c.require_ok();
}

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}
double dsilu(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}

TEST_CASE("kernels swiglu forward and backward with and without row_limit", "[kernels]") {
  std::mt19937 rng(304);
  struct Shape {
    std::int64_t rows, width;
  };
  for (ScalarType t : kTensorTypes) {
    Ctx c;
    for (const Shape& s : {Shape{1, 67}, Shape{17, 129}, Shape{33, 5}}) {
      const std::int64_t n = s.rows * s.width;
      const Vec gate = rand_t(t, n, rng, 2.0), up = rand_t(t, n, rng), dact = rand_t(t, n, rng);
      const Buffer bg = c.upload(t, gate), bu = c.upload(t, up), bd = c.upload(t, dact);
      // -1: no row_limit buffer.
      for (std::int64_t limit : {std::int64_t{-1}, s.rows, std::int64_t{5}, std::int64_t{0}, s.rows + 40}) {
        const std::int64_t live = limit < 0 ? s.rows : std::min(limit, s.rows);
        const Buffer bl = limit < 0 ? Buffer{} : c.upload_i64({limit});
        const std::string what = "rows,width " + shape_str({s.rows, s.width}) +
                                 (limit < 0 ? std::string(" no row_limit") : " row_limit " + std::to_string(limit));
        const Vec act0 = rand_t(t, n, rng), dg0 = rand_t(t, n, rng), du0 = rand_t(t, n, rng);
        const Buffer act = c.upload(t, act0), dg = c.upload(t, dg0), du = c.upload(t, du0);
        c.k().swiglu_forward(bg, bu, act, s.rows, s.width, bl);
        c.k().swiglu_backward(bg, bu, bd, dg, du, s.rows, s.width, bl);
        DVec ra = to_d(act0), rg = to_d(dg0), ru = to_d(du0);  // rows past the limit stay as they were
        for (std::int64_t i = 0; i < live * s.width; ++i) {
          const double g = gate[sz(i)], u = up[sz(i)], d = dact[sz(i)];
          ra[sz(i)] = silu(g) * u;
          rg[sz(i)] = d * u * dsilu(g);
          ru[sz(i)] = d * silu(g);
        }
        const Vec ga = c.get(act), gg = c.get(dg), gu = c.get(du);
        expect_close("swiglu_forward", tname(t), what, ga, ra, tol(t, t));
        expect_close("swiglu_backward", tname(t), what + ": dgate", gg, rg, tol(t, t));
        expect_close("swiglu_backward", tname(t), what + ": dup", gu, ru, tol(t, t));
        // Past the limit: bit for bit untouched.
        const std::size_t from = sz(live * s.width);
        expect_equal("swiglu_forward", tname(t), what + ": rows past the limit untouched",
                     Vec(ga.begin() + static_cast<std::ptrdiff_t>(from), ga.end()),
                     Vec(act0.begin() + static_cast<std::ptrdiff_t>(from), act0.end()));
        expect_equal("swiglu_backward", tname(t), what + ": rows past the limit untouched",
                     Vec(gg.begin() + static_cast<std::ptrdiff_t>(from), gg.end()),
                     Vec(dg0.begin() + static_cast<std::ptrdiff_t>(from), dg0.end()));
        expect_equal("swiglu_backward", tname(t), what + ": dup rows past the limit untouched",
                     Vec(gu.begin() + static_cast<std::ptrdiff_t>(from), gu.end()),
                     Vec(du0.begin() + static_cast<std::ptrdiff_t>(from), du0.end()));
      }
    }
    c.require_ok();
  }
}

TEST_CASE("kernels swiglu backward matches finite differences of the sum of act times R in fp32", "[kernels]") {
  std::mt19937 rng(309);
  Ctx c;
  const std::int64_t rows = 3, width = 5, n = rows * width;
  const Vec gate = randn(n, rng, 2.0), up = randn(n, rng), R = randn(n, rng);
  const Buffer bg = c.upload(kF32, gate), bu = c.upload(kF32, up), bR = c.upload(kF32, R);
  const Buffer pg = c.alloc(kF32, n), pu = c.alloc(kF32, n), act = c.alloc(kF32, n);
  for (const std::int64_t limit : {std::int64_t{-1}, std::int64_t{2}}) {  // -1: no row_limit buffer
    const Buffer bl = limit < 0 ? Buffer{} : c.upload_i64({limit});
    // Zeros where rows past the limit are not written: their finite differences are 0 too.
    const Buffer dg = c.alloc(kF32, n), du = c.alloc(kF32, n);
    c.k().fill(dg, 0.0), c.k().fill(du, 0.0), c.k().fill(act, 0.0);
    c.k().swiglu_backward(bg, bu, bR, dg, du, rows, width, bl);
    const Vec gg = c.get(dg), gu = c.get(du);
    auto objective = [&](const Vec& g2, const Vec& u2) {
      c.put(pg, g2), c.put(pu, u2);
      c.k().swiglu_forward(pg, pu, act, rows, width, bl);
      return dot_r(c.get(act), R);
    };
    const std::string what = "rows,width " + shape_str({rows, width}) +
                             (limit < 0 ? std::string(" no row_limit") : " row_limit " + std::to_string(limit));
    const std::vector<std::size_t> forced = {sz(n - 1)};  // the last row: past the limit when there is one
    check_gradient(
        "swiglu_backward", what + ": dgate", gate, gg, [&](const Vec& v) { return objective(v, up); }, 1e-2, 2e-3, rng,
        6, forced);
    check_gradient(
        "swiglu_backward", what + ": dup", up, gu, [&](const Vec& v) { return objective(gate, v); }, 1e-2, 2e-3, rng, 6,
        forced);
  }
  c.require_ok();
}

DVec reference_softmax_rows(const Vec& x, std::int64_t rows, std::int64_t n) {
  DVec p(sz(rows * n));
  for (std::int64_t r = 0; r < rows; ++r) {
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[sz(r * n + i)]));
    for (std::int64_t i = 0; i < n; ++i) sum += std::exp(x[sz(r * n + i)] - mx);
    for (std::int64_t i = 0; i < n; ++i) p[sz(r * n + i)] = std::exp(x[sz(r * n + i)] - mx) / sum;
  }
  return p;
}

TEST_CASE("kernels softmax_rows forward (also in place) and backward", "[kernels]") {
  std::mt19937 rng(305);
  struct Shape {
    std::int64_t rows, n;
  };
  const std::pair<ScalarType, ScalarType> type_pairs[] = {
      {kF32, kF32}, {kBf16, kBf16}, {kF16, kF16}, {kBf16, kF32}, {kF32, kF16}};
  for (const auto& [xt, pt] : type_pairs) {
    Ctx c;
    for (const Shape& s : {Shape{1, 1}, Shape{3, 5}, Shape{17, 67}, Shape{5, 129}}) {
      const std::string dims = "rows,n " + shape_str({s.rows, s.n});
      const std::int64_t count = s.rows * s.n;
      const Vec x = rand_t(xt, count, rng, 3.0);
      const DVec ref = reference_softmax_rows(x, s.rows, s.n);
      const Buffer bx = c.upload(xt, x), bp = c.alloc(pt, count);
      c.k().softmax_rows(bx, bp, s.rows, s.n);
      expect_close("softmax_rows", tname(xt, pt), dims, c.get(bp), ref, tol(xt, pt, s.n));
      if (xt == pt) {
        c.k().softmax_rows(bx, bx, s.rows, s.n);
        expect_close("softmax_rows", tname(xt, pt), dims + " in place", c.get(bx), ref, tol(xt, pt, s.n));
      }
      // dx = p (dp - sum(p dp)), p as stored.
      const Vec p = rounded(pt, Vec(ref.begin(), ref.end())), dp = rand_t(xt, count, rng);
      const Buffer bp2 = c.upload(pt, p), bdp = c.upload(xt, dp), bdx = c.alloc(xt, count);
      c.k().softmax_rows_backward(bp2, bdp, bdx, s.rows, s.n);
      DVec rdx(sz(count));
      for (std::int64_t r = 0; r < s.rows; ++r) {
        double dot = 0;
        for (std::int64_t i = 0; i < s.n; ++i) dot += static_cast<double>(p[sz(r * s.n + i)]) * dp[sz(r * s.n + i)];
        for (std::int64_t i = 0; i < s.n; ++i)
          rdx[sz(r * s.n + i)] = static_cast<double>(p[sz(r * s.n + i)]) * (dp[sz(r * s.n + i)] - dot);
      }
      expect_close("softmax_rows_backward", tname(pt, xt), dims, c.get(bdx), rdx, tol(xt, xt, s.n) * 2);
    }
    c.require_ok();
  }
}

TEST_CASE("kernels softmax_rows backward matches finite differences of the sum of p times R in fp32", "[kernels]") {
  std::mt19937 rng(310);
  Ctx c;
  const std::int64_t rows = 3, n = 6, count = rows * n;
  const Vec x = randn(count, rng, 2.0), R = randn(count, rng);
  const Buffer bx = c.upload(kF32, x), bp = c.alloc(kF32, count), bR = c.upload(kF32, R), bdx = c.alloc(kF32, count);
  c.k().softmax_rows(bx, bp, rows, n);
  c.k().softmax_rows_backward(bp, bR, bdx, rows, n);
  const Vec grad = c.get(bdx);
  const Buffer px = c.alloc(kF32, count), pp = c.alloc(kF32, count);
  auto objective = [&](const Vec& v) {
    c.put(px, v);
    c.k().softmax_rows(px, pp, rows, n);
    return dot_r(c.get(pp), R);
  };
  check_gradient("softmax_rows_backward", "rows,n " + shape_str({rows, n}), x, grad, objective, 1e-2, 2e-4, rng, 8);
  c.require_ok();
}

// ============================================================================================================
// Attention
// ============================================================================================================

std::string attention_dims(const AttentionShape& s) {
  return "b,s,h,kv,d " + shape_str({s.batch, s.seq, s.heads, s.kv_heads, s.head_dim});
}

struct AttentionRef {
  DVec out, lse, dq, dk, dv;
};

// Causal GQA attention and its analytic backward, in double.
AttentionRef reference_attention(const AttentionShape& s, const Vec& q, const Vec& k, const Vec& v, const Vec& dout) {
  const std::int64_t H = s.heads, KV = s.kv_heads, d = s.head_dim, T = s.seq, group = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  AttentionRef r;
  r.out.assign(sz(s.batch * T * H * d), 0.0);
  r.lse.assign(sz(s.batch * H * T), 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(sz(s.batch * T * KV * d), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto qi = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) {
    return sz(((b * T + t) * H + h) * d + i);
  };
  auto ki = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) {
    return sz(((b * T + t) * KV + h) * d + i);
  };
  DVec p(sz(T)), dp(sz(T));
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t kh = h / group;
      for (std::int64_t t = 0; t < T; ++t) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= t; ++j) {
          double sc = 0;
          for (std::int64_t i = 0; i < d; ++i) sc += static_cast<double>(q[qi(b, t, h, i)]) * k[ki(b, j, kh, i)];
          p[sz(j)] = sc * scale;
          mx = std::max(mx, p[sz(j)]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= t; ++j) sum += std::exp(p[sz(j)] - mx);
        const double lse = mx + std::log(sum);
        r.lse[sz((b * H + h) * T + t)] = lse;
        for (std::int64_t j = 0; j <= t; ++j) p[sz(j)] = std::exp(p[sz(j)] - lse);
        for (std::int64_t i = 0; i < d; ++i) {
          double o = 0;
          for (std::int64_t j = 0; j <= t; ++j) o += p[sz(j)] * v[ki(b, j, kh, i)];
          r.out[qi(b, t, h, i)] = o;
        }
        // Backward: dP_j = <dout, v_j>, D = <dout, out>, dS_j = P_j (dP_j - D).
        double D = 0;
        for (std::int64_t i = 0; i < d; ++i) D += static_cast<double>(dout[qi(b, t, h, i)]) * r.out[qi(b, t, h, i)];
        for (std::int64_t j = 0; j <= t; ++j) {
          double x = 0;
          for (std::int64_t i = 0; i < d; ++i) x += static_cast<double>(dout[qi(b, t, h, i)]) * v[ki(b, j, kh, i)];
          dp[sz(j)] = p[sz(j)] * (x - D);
        }
        for (std::int64_t j = 0; j <= t; ++j)
          for (std::int64_t i = 0; i < d; ++i) {
            r.dq[qi(b, t, h, i)] += dp[sz(j)] * k[ki(b, j, kh, i)] * scale;
            r.dk[ki(b, j, kh, i)] += dp[sz(j)] * q[qi(b, t, h, i)] * scale;
            r.dv[ki(b, j, kh, i)] += p[sz(j)] * dout[qi(b, t, h, i)];
          }
      }
    }
  return r;
}

Buffer attention_reserve_buffer(Ctx& c, const AttentionShape& s, bool use_reserve) {
  if (!use_reserve) return Buffer{};
  const std::int64_t n = c.k().attention_reserve(s);
  REQUIRE(n >= 0);
  return c.alloc(kF32, n);
}

// The CUDA backend's attention kernels by HZP_CUDA_ATTENTION (launch.h): the default (mma.sync where it applies),
// and the WMMA and simple ones it would otherwise run; one choice ("") elsewhere. Each row of the error table
// is named by its choice.
struct AttentionChoice {
  std::string value;  // HZP_CUDA_ATTENTION, "" for unset
  explicit AttentionChoice(std::string v) : value(std::move(v)) {
    if (value.empty())
      unsetenv("HZP_CUDA_ATTENTION");
    else
      setenv("HZP_CUDA_ATTENTION", value.c_str(), 1);
  }
  ~AttentionChoice() { unsetenv("HZP_CUDA_ATTENTION"); }
  std::string kernel(const char* name) const { return value.empty() ? name : std::string(name) + "[" + value + "]"; }
};

std::vector<std::string> attention_choices() {
  if (env().backend == "cuda") return {"", "wmma", "simple"};
  return {""};
}

TEST_CASE("kernels attention forward and backward with GQA against the fp64 reference", "[kernels]") {
  std::mt19937 rng(401);
  const AttentionShape shapes[] = {
      {2, 13, 4, 4, 16},  // heads / kv_heads = 1
      {2, 37, 4, 2, 24},  // 2
      {2, 13, 8, 2, 24},  // 4
      {2, 37, 8, 1, 16},  // 8
      {2, 1, 2, 2, 16},   // one position: out = v
      // The CUDA backend's tensor-core kernels (bf16 / fp16, head_dim a multiple of 16; 64 and 128 on
      // mma.sync): several 64-row tiles, the last one partial or full, GQA, and the largest head dimension.
      {2, 130, 4, 2, 64},
      {2, 64, 2, 1, 64},
      {1, 77, 2, 1, 128},
      {1, 200, 8, 2, 128},
  };
  for (const std::string& choice_value : attention_choices()) {
    const AttentionChoice choice(choice_value);
    for (ScalarType t : kTensorTypes) {
      Ctx c;
      for (const AttentionShape& s : shapes) {
        const std::int64_t nq = s.batch * s.seq * s.heads * s.head_dim, nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
        const Vec q = rand_t(t, nq, rng, 1.5), k = rand_t(t, nkv, rng), v = rand_t(t, nkv, rng),
                  dout = rand_t(t, nq, rng);
        const AttentionRef ref = reference_attention(s, q, k, v, dout);
        const Buffer bq = c.upload(t, q), bk = c.upload(t, k), bv = c.upload(t, v), bdo = c.upload(t, dout);
        const std::string fwd = choice.kernel("attention_forward"), bwd = choice.kernel("attention_backward");
        std::vector<Vec> results[2];  // per reserve choice: out, lse, dq, dk, dv
        for (bool use_reserve : {true, false}) {
          const std::string what = attention_dims(s) + (use_reserve ? " reserve" : " no reserve");
          const Buffer reserve = attention_reserve_buffer(c, s, use_reserve);
          const Buffer out = c.alloc(t, nq), lse = c.alloc(kF32, s.batch * s.heads * s.seq);
          const Buffer dq = c.upload(t, rand_t(t, nq, rng)), dk = c.upload(t, rand_t(t, nkv, rng)),
                       dv = c.upload(t, rand_t(t, nkv, rng));  // overwritten, not accumulated
          c.k().attention_forward(s, bq, bk, bv, out, lse, reserve);
          c.k().attention_backward(s, bq, bk, bv, out, bdo, lse, reserve, dq, dk, dv);
          auto& res = results[use_reserve ? 0 : 1];
          res = {c.get(out), c.get(lse), c.get(dq), c.get(dk), c.get(dv)};
          expect_close(fwd, tname(t), what + ": out", res[0], ref.out, tol(t, t, s.seq));
          expect_close(fwd, tname(t, kF32), what + ": lse", res[1], ref.lse, tol(t, kF32, s.seq), 1.0);
          expect_close(bwd, tname(t), what + ": dq", res[2], ref.dq, 2 * tol(t, t, s.seq));
          expect_close(bwd, tname(t), what + ": dk", res[3], ref.dk, 2 * tol(t, t, s.seq));
          expect_close(bwd, tname(t), what + ": dv", res[4], ref.dv, 2 * tol(t, t, s.seq));
        }
        // The two reserve choices agree with each other.
        const char* names[] = {"out", "lse", "dq", "dk", "dv"};
        for (int i = 0; i < 5; ++i)
          expect_close(i < 2 ? fwd : bwd, i == 1 ? tname(t, kF32) : tname(t),
                       attention_dims(s) + ": " + names[i] + " no reserve vs reserve", results[1][sz(i)],
                       to_d(results[0][sz(i)]), 2 * tol(t, t, s.seq), i == 1 ? 1.0 : 0.0);
      }
      c.require_ok();
    }
  }
}

// PASA (AttentionAlgorithm::kPasa, docs/pasa.md): the same output and log-sum-exp as softmax attention, and the
// same backward from its (recovered) log-sum-exp; fp16 is its purpose. Sequences past one 128-key block, with a
// partial last block, and GQA. PASA is fp16 arithmetic end to end (scores, statistics, accumulators: what its
// kernel does on a GPU), where the CPU's standard attention computes in fp32 and rounds only its outputs; and
// its log-sum-exp is recovered from fp16 statistics, one multiplied by beta / (1 - beta) = 63.5. So its
// errors are those of fp16 arithmetic, not of one rounding: measured on the CPU 3.2e-3 (out), 2.7e-3 (lse)
// and 1.4e-2 (gradients) against 3.3e-4, 1.3e-7 and 3.6e-4 for the standard kernel on the same inputs. The
// bounds below leave 3x room over PASA's.
TEST_CASE("kernels attention with PASA in fp16 against the fp64 reference", "[kernels]") {
  std::mt19937 rng(409);
  // Head dims 16 and 32 run the CUDA backend's WMMA kernel; 64 and 128 its mma.sync one (unless the choice is
  // wmma), with a partial last block of 128 keys and a partial last tile of 64 rows.
  const AttentionShape shapes[] = {
      {1, 150, 2, 1, 32, AttentionAlgorithm::kPasa},
      {2, 300, 4, 2, 16, AttentionAlgorithm::kPasa},
      {1, 200, 4, 2, 64, AttentionAlgorithm::kPasa},
      {2, 140, 2, 1, 128, AttentionAlgorithm::kPasa},
  };
  const ScalarType t = ScalarType::kFp16;
  for (const std::string& choice_value : attention_choices()) {
    if (choice_value == "simple") continue;  // PASA has no simple kernel: "simple" runs the default
    const AttentionChoice choice(choice_value);
    Ctx c;
    for (const AttentionShape& s : shapes) {
      const std::int64_t nq = s.batch * s.seq * s.heads * s.head_dim, nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
      const Vec q = rand_t(t, nq, rng, 1.5), k = rand_t(t, nkv, rng), v = rand_t(t, nkv, rng),
                dout = rand_t(t, nq, rng);
      const AttentionRef ref = reference_attention(s, q, k, v, dout);
      const Buffer bq = c.upload(t, q), bk = c.upload(t, k), bv = c.upload(t, v), bdo = c.upload(t, dout);
      const Buffer reserve = attention_reserve_buffer(c, s, true);
      const Buffer out = c.alloc(t, nq), lse = c.alloc(kF32, s.batch * s.heads * s.seq);
      const Buffer dq = c.alloc(t, nq), dk = c.alloc(t, nkv), dv = c.alloc(t, nkv);
      c.k().attention_forward(s, bq, bk, bv, out, lse, reserve);
      c.k().attention_backward(s, bq, bk, bv, out, bdo, lse, reserve, dq, dk, dv);
      const std::string what = attention_dims(s) + " pasa";
      constexpr double kOut = 0.01, kLse = 0.01, kGrad = 0.04;
      const std::string fwd = choice.kernel("attention_forward_pasa"), bwd = choice.kernel("attention_backward_pasa");
      expect_close(fwd, tname(t), what + ": out", c.get(out), ref.out, kOut);
      expect_close(fwd, tname(t, kF32), what + ": lse", c.get(lse), ref.lse, kLse, 1.0);
      expect_close(bwd, tname(t), what + ": dq", c.get(dq), ref.dq, kGrad);
      expect_close(bwd, tname(t), what + ": dk", c.get(dk), ref.dk, kGrad);
      expect_close(bwd, tname(t), what + ": dv", c.get(dv), ref.dv, kGrad);
    }
    c.require_ok();
  }
}

// PASA's purpose (docs/pasa.md): queries and keys sharing a bias of 30 at head dimension 128 give scores near
// 30^2 * 128 = 115,200, past fp16's 65504, where standard fp16 flash attention overflows (build/pasa_bench);
// PASA's shifted scores stay finite and its output stays close to the exact one in RMS (the benchmark measured
// a relative RMSE of 0.004 and a log-sum-exp error of 6 in ~7000 at this bias; the bounds leave room). Single
// rows can be far off: their softmax is nearly one-hot, and an fp16 rounding of a score picks another key.
TEST_CASE("kernels attention with PASA does not overflow on biased fp16 inputs", "[kernels]") {
  std::mt19937 rng(410);
  const AttentionShape s{1, 200, 2, 1, 128, AttentionAlgorithm::kPasa};
  const ScalarType t = ScalarType::kFp16;
  Ctx c;
  const std::int64_t nq = s.batch * s.seq * s.heads * s.head_dim, nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
  // Values of the same family, as the benchmark's (its relative RMSE divides by their RMS, about 30).
  const Vec q = rand_t(t, nq, rng, 0.3, 30.0), k = rand_t(t, nkv, rng, 0.3, 30.0), v = rand_t(t, nkv, rng, 0.3, 30.0);
  const AttentionRef ref = reference_attention(s, q, k, v, rand_t(t, nq, rng));
  const Buffer bq = c.upload(t, q), bk = c.upload(t, k), bv = c.upload(t, v);
  const Buffer reserve = attention_reserve_buffer(c, s, true);
  const Buffer out = c.alloc(t, nq), lse = c.alloc(kF32, s.batch * s.heads * s.seq);
  c.k().attention_forward(s, bq, bk, bv, out, lse, reserve);
  const Vec got_out = c.get(out), got_lse = c.get(lse);
  c.require_ok();
  CHECK(std::all_of(got_out.begin(), got_out.end(), [](float x) { return std::isfinite(x); }));
  CHECK(std::all_of(got_lse.begin(), got_lse.end(), [](float x) { return std::isfinite(x); }));
  CHECK(*std::max_element(ref.lse.begin(), ref.lse.end()) > 65504.0 / std::sqrt(128.0));  // it would overflow
  const std::string what = attention_dims(s) + " pasa, bias 30";
  double err2 = 0, ref2 = 0;
  for (std::size_t i = 0; i < got_out.size(); ++i) {
    err2 += (got_out[i] - ref.out[i]) * (got_out[i] - ref.out[i]);
    ref2 += ref.out[i] * ref.out[i];
  }
  const double relative_rmse = std::sqrt(err2 / ref2);
  INFO(what << ": relative RMSE of out " << relative_rmse);
  CHECK(relative_rmse < 0.02);
  expect_close("attention_forward_pasa", tname(t, kF32), what + ": lse", got_lse, ref.lse, 0.003, 1.0);
}

TEST_CASE("kernels attention is causal: later keys and values do not change earlier rows", "[kernels]") {
  std::mt19937 rng(402);
  for (ScalarType t : kTensorTypes) {
    Ctx c;
    const AttentionShape s{2, 100, 4, 2, 32};  // two 64-row tiles of the CUDA backend's tensor-core kernels
    const std::int64_t nq = s.batch * s.seq * s.heads * s.head_dim, nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
    const std::int64_t kv_row = s.kv_heads * s.head_dim, q_row = s.heads * s.head_dim;
    const Vec q = rand_t(t, nq, rng);
    Vec k = rand_t(t, nkv, rng), v = rand_t(t, nkv, rng);
    const Buffer bq = c.upload(t, q), bk = c.upload(t, k), bv = c.upload(t, v);
    const Buffer out = c.alloc(t, nq), lse = c.alloc(kF32, s.batch * s.heads * s.seq);
    const Buffer reserve = attention_reserve_buffer(c, s, true);
    c.k().attention_forward(s, bq, bk, bv, out, lse, reserve);
    const Vec out1 = c.get(out), lse1 = c.get(lse);
    // Change the keys and values of the last 5 positions of each sequence.
    const std::int64_t cut = s.seq - 5;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t tt = cut; tt < s.seq; ++tt)
        for (std::int64_t i = 0; i < kv_row; ++i) {
          k[sz((b * s.seq + tt) * kv_row + i)] = round_to(t, 10.0f * k[sz((b * s.seq + tt) * kv_row + i)] + 3.0f);
          v[sz((b * s.seq + tt) * kv_row + i)] = round_to(t, -v[sz((b * s.seq + tt) * kv_row + i)] + 5.0f);
        }
    c.put(bk, k);
    c.put(bv, v);
    c.k().attention_forward(s, bq, bk, bv, out, lse, reserve);
    const Vec out2 = c.get(out), lse2 = c.get(lse);
    Vec early1, early2, late1, late2;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t tt = 0; tt < s.seq; ++tt)
        for (std::int64_t i = 0; i < q_row; ++i) {
          const std::size_t at = sz((b * s.seq + tt) * q_row + i);
          (tt < cut ? early1 : late1).push_back(out1[at]);
          (tt < cut ? early2 : late2).push_back(out2[at]);
        }
    expect_close("attention_forward", tname(t), attention_dims(s) + ": causal, rows before the change", early2,
                 to_d(early1), 1e-6 + ulp_rel(t));
    double moved = 0;
    for (std::size_t i = 0; i < late1.size(); ++i) moved = std::max(moved, std::abs(double{late1[i]} - late2[i]));
    CHECK(moved > 0.1);  // the changed positions do matter to their own rows
    Vec lse_early1, lse_early2;
    for (std::int64_t bh = 0; bh < s.batch * s.heads; ++bh)
      for (std::int64_t tt = 0; tt < cut; ++tt) {
        lse_early1.push_back(lse1[sz(bh * s.seq + tt)]);
        lse_early2.push_back(lse2[sz(bh * s.seq + tt)]);
      }
    expect_close("attention_forward", tname(t, kF32), attention_dims(s) + ": causal lse", lse_early2, to_d(lse_early1),
                 1e-6, 1.0);
    c.require_ok();
  }
}

TEST_CASE("kernels attention backward matches finite differences of the sum of out times R in fp32", "[kernels]") {
  std::mt19937 rng(403);
  const AttentionShape s{2, 5, 4, 2, 4};
  const std::int64_t nq = s.batch * s.seq * s.heads * s.head_dim, nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
  for (bool use_reserve : {true, false}) {
    Ctx c;
    const Vec q = randn(nq, rng), k = randn(nkv, rng), v = randn(nkv, rng), R = randn(nq, rng);
    const Buffer bq = c.upload(kF32, q), bk = c.upload(kF32, k), bv = c.upload(kF32, v), bR = c.upload(kF32, R);
    const Buffer out = c.alloc(kF32, nq), lse = c.alloc(kF32, s.batch * s.heads * s.seq);
    const Buffer dq = c.alloc(kF32, nq), dk = c.alloc(kF32, nkv), dv = c.alloc(kF32, nkv);
    const Buffer reserve = attention_reserve_buffer(c, s, use_reserve);
    c.k().attention_forward(s, bq, bk, bv, out, lse, reserve);
    c.k().attention_backward(s, bq, bk, bv, out, bR, lse, reserve, dq, dk, dv);
    const Vec gq = c.get(dq), gk = c.get(dk), gv = c.get(dv);
    // L(q, k, v) = sum(out * R), each evaluation a forward on the device.
    auto objective = [&](const Vec& q2, const Vec& k2, const Vec& v2) {
      c.put(bq, q2), c.put(bk, k2), c.put(bv, v2);
      c.k().attention_forward(s, bq, bk, bv, out, lse, reserve);
      const Vec o = c.get(out);
      double sum = 0;
      for (std::size_t i = 0; i < o.size(); ++i) sum += static_cast<double>(o[i]) * R[i];
      return sum;
    };
    const std::string what = attention_dims(s) + (use_reserve ? " reserve" : " no reserve");
    check_finite_differences(
        "attention_backward", what + ": dq", q, gq, [&](const Vec& x) { return objective(x, k, v); }, 1e-2, 3e-3);
    check_finite_differences(
        "attention_backward", what + ": dk", k, gk, [&](const Vec& x) { return objective(q, x, v); }, 1e-2, 3e-3);
    check_finite_differences(
        "attention_backward", what + ": dv", v, gv, [&](const Vec& x) { return objective(q, k, x); }, 1e-2, 3e-3);
    c.require_ok();
  }
}

// ============================================================================================================
// Cross-entropy
// ============================================================================================================

Buffer cross_entropy_reserve_buffer(Ctx& c, std::int64_t rows, std::int64_t vocab) {
  const std::int64_t n = c.k().cross_entropy_reserve(rows, vocab);
  REQUIRE(n >= 0);
  return c.alloc(kF32, n);
}

TEST_CASE("kernels cross_entropy forward accumulates the loss and backward writes the gradient, also in place",
          "[kernels]") {
  std::mt19937 rng(501);
  struct Shape {
    std::int64_t rows, vocab;
  };
  for (ScalarType t : kTensorTypes) {
    for (const Shape& s : {Shape{33, 7}, Shape{5, 32000}, Shape{3, 128000}, Shape{2, 131072}}) {
      Ctx c;
      const std::string dims = "rows,vocab " + shape_str({s.rows, s.vocab});
      const std::int64_t n = s.rows * s.vocab;
      const Vec logits = rand_t(t, n, rng, 3.0);
      I32 targets(sz(s.rows));
      std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(s.vocab - 1));
      for (auto& x : targets) x = pick(rng);
      targets[0] = 0;
      if (s.rows > 1) targets[1] = static_cast<std::int32_t>(s.vocab - 1);
      // Reference: loss = lse - x[target]; dlogits = scale (softmax - onehot).
      double loss = 0;
      DVec p(sz(n));
      for (std::int64_t r = 0; r < s.rows; ++r) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (std::int64_t i = 0; i < s.vocab; ++i) mx = std::max(mx, static_cast<double>(logits[sz(r * s.vocab + i)]));
        for (std::int64_t i = 0; i < s.vocab; ++i) sum += std::exp(logits[sz(r * s.vocab + i)] - mx);
        const double lse = mx + std::log(sum);
        loss += lse - logits[sz(r * s.vocab + targets[sz(r)])];
        for (std::int64_t i = 0; i < s.vocab; ++i) p[sz(r * s.vocab + i)] = std::exp(logits[sz(r * s.vocab + i)] - lse);
      }
      const Buffer bl = c.upload(t, logits), bt = c.upload_i32(targets);
      const Buffer reserve = cross_entropy_reserve_buffer(c, s.rows, s.vocab);
      const Buffer loss_sum = c.upload_f64({1.25});
      c.k().cross_entropy_forward(bl, bt, reserve, loss_sum, s.rows, s.vocab);
      const DVec once = c.get_f64(loss_sum);
      c.k().cross_entropy_forward(bl, bt, reserve, loss_sum, s.rows, s.vocab);
      const DVec twice = c.get_f64(loss_sum);
      // The logits are read exactly and the loss is fp32 / fp64 arithmetic whatever their type.
      const double loss_tol = tol(kF32, kF64, static_cast<double>(s.vocab));
      expect_close("cross_entropy_forward", tname(t, kF64), dims + ": 1.25 + loss", once, DVec{1.25 + loss}, loss_tol);
      expect_close("cross_entropy_forward", tname(t, kF64), dims + ": accumulates", twice, DVec{1.25 + 2 * loss},
                   loss_tol);

      const float scale = 1.0f / static_cast<float>(s.rows);
      DVec ref(sz(n)), ref_rest(sz(n));  // ref_rest: the non-target entries alone (the target's zeroed)
      for (std::int64_t r = 0; r < s.rows; ++r)
        for (std::int64_t i = 0; i < s.vocab; ++i) {
          const std::size_t at = sz(r * s.vocab + i);
          const bool hit = i == targets[sz(r)];
          ref[at] = scale * (p[at] - (hit ? 1.0 : 0.0));
          ref_rest[at] = hit ? 0.0 : scale * p[at];
        }
      auto check_grad = [&](const Vec& got, const std::string& what) {
        const double g_tol = tol(t, t, static_cast<double>(s.vocab));
        expect_close("cross_entropy_backward", tname(t), dims + what, got, ref, g_tol);
        // The small entries on their own scale (a wrong softmax would hide under the target's -1).
        Vec rest = got;
        for (std::int64_t r = 0; r < s.rows; ++r) rest[sz(r * s.vocab + targets[sz(r)])] = 0.0f;
        expect_close("cross_entropy_backward", tname(t), dims + what + ", non-target entries", rest, ref_rest, g_tol);
      };
      const Buffer dl = c.upload(t, rand_t(t, n, rng));
      c.k().cross_entropy_backward(bl, bt, reserve, scale, dl, s.rows, s.vocab);
      check_grad(c.get(dl), " separate dlogits");
      // In place: dlogits is the logits buffer (after a fresh forward into the reserve).
      c.k().cross_entropy_forward(bl, bt, reserve, loss_sum, s.rows, s.vocab);
      c.k().cross_entropy_backward(bl, bt, reserve, scale, bl, s.rows, s.vocab);
      check_grad(c.get(bl), " in place");
      c.require_ok();
    }
  }
}

TEST_CASE("kernels cross_entropy backward matches finite differences of the loss in fp32", "[kernels]") {
  std::mt19937 rng(502);
  Ctx c;
  const std::int64_t rows = 3, vocab = 7;
  const Vec logits = randn(rows * vocab, rng, 2.0);
  const I32 targets = {2, 0, 6};
  const Buffer bl = c.upload(kF32, logits), bt = c.upload_i32(targets);
  const Buffer reserve = cross_entropy_reserve_buffer(c, rows, vocab);
  const Buffer loss_sum = c.upload_f64({0.0}), dl = c.alloc(kF32, rows * vocab);
  c.k().cross_entropy_forward(bl, bt, reserve, loss_sum, rows, vocab);
  c.k().cross_entropy_backward(bl, bt, reserve, 1.0f, dl, rows, vocab);
  const Vec grad = c.get(dl);
  auto loss = [&](const Vec& x) {
    c.put(bl, x);
    c.put_f64(loss_sum, {0.0});
    c.k().cross_entropy_forward(bl, bt, reserve, loss_sum, rows, vocab);
    return c.get_f64(loss_sum)[0];
  };
  check_finite_differences("cross_entropy_backward", "rows,vocab 3x7", logits, grad, loss, 1e-2, 2e-3);
  c.require_ok();
}

// ============================================================================================================
// MoE
// ============================================================================================================

// Top-k of each row (descending, ties to the lower index), with renormalised weights and their sum.
struct TopK {
  I32 selected;
  DVec weight, psum;
  I64 count;
};
TopK reference_topk(const Vec& probs, std::int64_t t, std::int64_t e, std::int64_t k) {
  TopK r;
  r.count.assign(sz(e), 0);
  for (std::int64_t row = 0; row < t; ++row) {
    std::vector<std::int32_t> order(sz(e));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return probs[sz(row * e + a)] > probs[sz(row * e + b)]; });
    double sum = 0;
    for (std::int64_t s = 0; s < k; ++s) sum += probs[sz(row * e + order[sz(s)])];
    r.psum.push_back(sum);
    for (std::int64_t s = 0; s < k; ++s) {
      r.selected.push_back(order[sz(s)]);
      r.weight.push_back(probs[sz(row * e + order[sz(s)])] / sum);
      ++r.count[sz(order[sz(s)])];
    }
  }
  return r;
}

// Router probabilities: softmax rows of random logits, with exact ties planted in the first rows.
Vec router_probs(std::int64_t t, std::int64_t e, std::mt19937& rng) {
  Vec logits = randn(t * e, rng, 1.5);
  DVec p = reference_softmax_rows(logits, t, e);
  Vec probs(p.begin(), p.end());
  if (t >= 1)
    for (std::int64_t i = 0; i < e; ++i) probs[sz(i)] = 1.0f / static_cast<float>(e);  // all tied
  if (t >= 2 && e >= 3) {
    for (std::int64_t i = 0; i < e; ++i) probs[sz(e + i)] = 0.01f;
    probs[sz(e + e - 1)] = 0.3f;  // a tie at the top between the last and the middle expert
    probs[sz(e + e / 2)] = 0.3f;
    probs[sz(e + 0)] = 0.2f;
  }
  if (t >= 3 && e >= 3) {
    for (std::int64_t i = 0; i < e; ++i) probs[sz(2 * e + i)] = 0.05f;  // a tie for every place but the first
    probs[sz(2 * e + 1)] = 0.4f;
  }
  return probs;
}

TEST_CASE("kernels moe_topk picks the largest with ties to the lower index and counts per expert", "[kernels]") {
  std::mt19937 rng(601);
  struct Shape {
    std::int64_t t, e, k;
  };
  Ctx c;
  for (const Shape& s : {Shape{37, 8, 2}, Shape{17, 5, 3}, Shape{3, 4, 1}, Shape{5, 3, 3}, Shape{129, 16, 4}}) {
    const std::string dims = "t,E,k " + shape_str({s.t, s.e, s.k});
    const Vec probs = router_probs(s.t, s.e, rng);
    const TopK ref = reference_topk(probs, s.t, s.e, s.k);
    const Buffer bp = c.upload(kF32, probs);
    const Buffer sel = c.upload_i32(I32(sz(s.t * s.k), -5)), w = c.alloc(kF32, s.t * s.k), ps = c.alloc(kF32, s.t);
    const Buffer cnt = c.upload_i64(I64(sz(s.e), 99));  // overwritten
    c.k().moe_topk(bp, sel, w, ps, cnt, s.t, s.e, s.k);
    expect_equal("moe_topk", "fp32", dims + ": selected", c.get_i32(sel), ref.selected);
    expect_close("moe_topk", "fp32", dims + ": weight", c.get(w), ref.weight, tol(kF32, kF32, s.k));
    expect_close("moe_topk", "fp32", dims + ": psum", c.get(ps), ref.psum, tol(kF32, kF32, s.k));
    expect_equal("moe_topk", "int64", dims + ": expert_count", c.get_i64(cnt), ref.count);
  }
  c.require_ok();
}

TEST_CASE("kernels moe_aux_loss writes the fractions and accumulates the aux loss", "[kernels]") {
  std::mt19937 rng(602);
  Ctx c;
  for (const auto& [t, e, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{37, 8, 2}, {5, 3, 3}, {1, 4, 1}}) {
    const std::string dims = "t,E,k " + shape_str({t, e, k});
    const Vec probs = router_probs(t, e, rng);
    const TopK tk = reference_topk(probs, t, e, k);
    const Buffer bp = c.upload(kF32, probs), cnt = c.upload_i64(tk.count), frac = c.alloc(kF32, e);
    const Buffer aux = c.upload_f64({0.5});
    c.k().moe_aux_loss(bp, cnt, frac, aux, t, e, k);
    const DVec once = c.get_f64(aux);
    c.k().moe_aux_loss(bp, cnt, frac, aux, t, e, k);
    const DVec twice = c.get_f64(aux);
    DVec fraction(sz(e));
    double a = 0;
    for (std::int64_t x = 0; x < e; ++x) {
      fraction[sz(x)] = static_cast<double>(tk.count[sz(x)]) / static_cast<double>(t * k);
      double mean = 0;
      for (std::int64_t r = 0; r < t; ++r) mean += probs[sz(r * e + x)];
      a += fraction[sz(x)] * mean / static_cast<double>(t);
    }
    a *= static_cast<double>(e);
    expect_close("moe_aux_loss", "fp32", dims + ": fraction", c.get(frac), fraction, tol(kF32, kF32));
    expect_close("moe_aux_loss", "fp64", dims + ": 0.5 + aux", once, DVec{0.5 + a}, tol(kF32, kF64, t));
    expect_close("moe_aux_loss", "fp64", dims + ": accumulates", twice, DVec{0.5 + 2 * a}, tol(kF32, kF64, t));
  }
  c.require_ok();
}

// send_row of the permutation ordered by (expert, token, slot).
I64 reference_send_row(const I32& selected, std::int64_t t, std::int64_t k) {
  std::vector<std::tuple<std::int32_t, std::int64_t, std::int64_t>> keys;
  for (std::int64_t i = 0; i < t; ++i)
    for (std::int64_t s = 0; s < k; ++s) keys.emplace_back(selected[sz(i * k + s)], i, s);
  std::sort(keys.begin(), keys.end());
  I64 send(sz(t * k));
  for (std::size_t p = 0; p < keys.size(); ++p)
    send[sz(std::get<1>(keys[p]) * k + std::get<2>(keys[p]))] = static_cast<std::int64_t>(p);
  return send;
}

TEST_CASE("kernels moe_permute orders rows by expert, token and slot", "[kernels]") {
  std::mt19937 rng(603);
  struct Shape {
    std::int64_t t, e, k, h;
  };
  for (ScalarType ty : kTensorTypes) {
    Ctx c;
    for (const Shape& s : {Shape{37, 8, 2, 19}, Shape{5, 3, 3, 1}, Shape{17, 6, 1, 33}}) {
      const std::string dims = "t,E,k,h " + shape_str({s.t, s.e, s.k, s.h});
      const TopK tk = reference_topk(router_probs(s.t, s.e, rng), s.t, s.e, s.k);
      const Vec x = rand_t(ty, s.t * s.h, rng);
      const Buffer bx = c.upload(ty, x), sel = c.upload_i32(tk.selected), cnt = c.upload_i64(tk.count);
      const Buffer rows = c.alloc(ty, s.t * s.k * s.h), send = c.upload_i64(I64(sz(s.t * s.k), -1));
      c.k().moe_permute(bx, sel, cnt, rows, send, s.t, s.e, s.k, s.h);
      const I64 want_send = reference_send_row(tk.selected, s.t, s.k);
      Vec want_rows(sz(s.t * s.k * s.h));
      for (std::int64_t i = 0; i < s.t; ++i)
        for (std::int64_t sl = 0; sl < s.k; ++sl)
          for (std::int64_t j = 0; j < s.h; ++j)
            want_rows[sz(want_send[sz(i * s.k + sl)] * s.h + j)] = x[sz(i * s.h + j)];
      expect_equal("moe_permute", "int64", dims + ": send_row", c.get_i64(send), want_send);
      expect_equal("moe_permute", tname(ty), dims + ": rows", c.get(rows), want_rows);
    }
    c.require_ok();
  }
}

// A random permutation of t*k rows as send_row.
I64 random_send_row(std::int64_t t, std::int64_t k, std::mt19937& rng) {
  I64 send(sz(t * k));
  std::iota(send.begin(), send.end(), 0);
  std::shuffle(send.begin(), send.end(), rng);
  return send;
}

TEST_CASE("kernels moe_combine weighted and unweighted, and its backward", "[kernels]") {
  std::mt19937 rng(604);
  struct Shape {
    std::int64_t t, k, h;
  };
  const std::pair<ScalarType, ScalarType> type_pairs[] = {{kF32, kF32}, {kBf16, kBf16}, {kF16, kF16}, {kBf16, kF32}};
  for (const auto& [rt, xt] : type_pairs) {
    Ctx c;
    for (const Shape& s : {Shape{37, 2, 19}, Shape{5, 3, 1}, Shape{17, 1, 67}}) {
      const std::string dims = "t,k,h " + shape_str({s.t, s.k, s.h});
      const I64 send = random_send_row(s.t, s.k, rng);
      const Vec rows = rand_t(rt, s.t * s.k * s.h, rng);
      const Vec weight = randn(s.t * s.k, rng, 0.3, 0.5);
      const Buffer br = c.upload(rt, rows), bs = c.upload_i64(send), bw = c.upload(kF32, weight);
      for (bool weighted : {true, false})
        for (bool acc : {false, true}) {
          const Vec x0 = rand_t(xt, s.t * s.h, rng);
          const Buffer bx = c.upload(xt, x0);
          c.k().moe_combine(br, bs, weighted ? bw : Buffer{}, bx, s.t, s.k, s.h, acc);
          DVec ref(sz(s.t * s.h));
          for (std::int64_t i = 0; i < s.t; ++i)
            for (std::int64_t j = 0; j < s.h; ++j) {
              double sum = acc ? x0[sz(i * s.h + j)] : 0.0;
              for (std::int64_t sl = 0; sl < s.k; ++sl)
                sum += (weighted ? weight[sz(i * s.k + sl)] : 1.0) * rows[sz(send[sz(i * s.k + sl)] * s.h + j)];
              ref[sz(i * s.h + j)] = sum;
            }
          expect_close("moe_combine", tname(rt, xt),
                       dims + (weighted ? " weighted" : " unweighted") + (acc ? " accumulate" : ""), c.get(bx), ref,
                       tol(rt, xt, s.k));
        }
      if (rt != xt) continue;
      // Backward: grad_rows[send] = weight dx; dweight = <dx, rows[send]>.
      const Vec dx = rand_t(rt, s.t * s.h, rng);
      const Buffer bdx = c.upload(rt, dx), gr = c.alloc(rt, s.t * s.k * s.h), dw = c.alloc(kF32, s.t * s.k);
      c.k().moe_combine_backward(bdx, br, bs, bw, gr, dw, s.t, s.k, s.h);
      DVec rgr(sz(s.t * s.k * s.h)), rdw(sz(s.t * s.k));
      for (std::int64_t i = 0; i < s.t; ++i)
        for (std::int64_t sl = 0; sl < s.k; ++sl) {
          const std::int64_t row = send[sz(i * s.k + sl)];
          double dot = 0;
          for (std::int64_t j = 0; j < s.h; ++j) {
            rgr[sz(row * s.h + j)] = static_cast<double>(weight[sz(i * s.k + sl)]) * dx[sz(i * s.h + j)];
            dot += static_cast<double>(dx[sz(i * s.h + j)]) * rows[sz(row * s.h + j)];
          }
          rdw[sz(i * s.k + sl)] = dot;
        }
      expect_close("moe_combine_backward", tname(rt), dims + ": grad_rows", c.get(gr), rgr, tol(rt, rt));
      expect_close("moe_combine_backward", tname(rt, kF32), dims + ": dweight", c.get(dw), rdw, tol(rt, kF32, s.h));
    }
    c.require_ok();
  }
}

TEST_CASE("kernels moe_combine_backward matches finite differences of the sum of x times R in fp32", "[kernels]") {
  std::mt19937 rng(610);
  Ctx c;
  const std::int64_t t = 4, k = 2, h = 3;
  const I64 send = random_send_row(t, k, rng);
  const Vec rows = randn(t * k * h, rng), weight = randn(t * k, rng, 0.3, 0.5), R = randn(t * h, rng);
  const Buffer br = c.upload(kF32, rows), bs = c.upload_i64(send), bw = c.upload(kF32, weight), bR = c.upload(kF32, R);
  const Buffer gr = c.alloc(kF32, t * k * h), dw = c.alloc(kF32, t * k);
  c.k().moe_combine_backward(bR, br, bs, bw, gr, dw, t, k, h);
  const Vec g_rows = c.get(gr), g_weight = c.get(dw);
  const Buffer pr = c.alloc(kF32, t * k * h), pw = c.alloc(kF32, t * k), px = c.alloc(kF32, t * h);
  auto objective = [&](const Vec& r2, const Vec& w2) {
    c.put(pr, r2), c.put(pw, w2);
    c.k().moe_combine(pr, bs, pw, px, t, k, h, false);
    return dot_r(c.get(px), R);
  };
  const std::string dims = "t,k,h " + shape_str({t, k, h});
  check_gradient(
      "moe_combine_backward", dims + ": grad_rows", rows, g_rows, [&](const Vec& v) { return objective(v, weight); },
      0.1, 1e-5, rng);
  check_gradient(
      "moe_combine_backward", dims + ": dweight", weight, g_weight, [&](const Vec& v) { return objective(rows, v); },
      0.1, 1e-5, rng);
  c.require_ok();
}

TEST_CASE("kernels moe_router_backward follows its formula", "[kernels]") {
  std::mt19937 rng(605);
  Ctx c;
  for (const auto& [t, e, k] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{17, 8, 2}, {5, 4, 4}, {37, 6, 1}}) {
    const std::string dims = "t,E,k " + shape_str({t, e, k});
    const Vec probs = router_probs(t, e, rng);
    const TopK tk = reference_topk(probs, t, e, k);
    const Vec weight(tk.weight.begin(), tk.weight.end()), psum(tk.psum.begin(), tk.psum.end());
    const Vec dweight = randn(t * k, rng), fraction = randn(e, rng, 0.1, 0.2);
    const float aux_coef = 0.01f;
    const Buffer bdw = c.upload(kF32, dweight), bw = c.upload(kF32, weight), bs = c.upload_i32(tk.selected),
                 bps = c.upload(kF32, psum), bf = c.upload(kF32, fraction);
    const Buffer dp = c.upload(kF32, Vec(sz(t * e), 42.0f));
    c.k().moe_router_backward(bdw, bw, bs, bps, bf, aux_coef, dp, t, e, k);
    DVec ref(sz(t * e));
    for (std::int64_t i = 0; i < t; ++i) {
      double dot = 0;
      for (std::int64_t r = 0; r < k; ++r) dot += static_cast<double>(dweight[sz(i * k + r)]) * weight[sz(i * k + r)];
      for (std::int64_t x = 0; x < e; ++x) ref[sz(i * e + x)] = static_cast<double>(aux_coef) * fraction[sz(x)];
      for (std::int64_t s = 0; s < k; ++s)
        ref[sz(i * e + tk.selected[sz(i * k + s)])] += (dweight[sz(i * k + s)] - dot) / psum[sz(i)];
    }
    expect_close("moe_router_backward", "fp32", dims, c.get(dp), ref, tol(kF32, kF32, k));
  }
  c.require_ok();
}

TEST_CASE("kernels moe_router_backward matches finite differences through topk, combine and the aux loss",
          "[kernels]") {
  std::mt19937 rng(606);
  Ctx c;
  const std::int64_t t = 6, e = 5, k = 2, h = 3;
  const double aux_scale = 0.05;  // L = sum(combine * R) + aux_scale * aux
  // Probabilities with distinct values (gaps >= 0.01) so that the selection survives the perturbations.
  Vec probs(sz(t * e));
  for (std::int64_t i = 0; i < t; ++i) {
    std::vector<int> perm(sz(e));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (std::int64_t x = 0; x < e; ++x) probs[sz(i * e + x)] = 0.05f + 0.07f * static_cast<float>(perm[sz(x)]);
  }
  const TopK base = reference_topk(probs, t, e, k);
  const I64 send = reference_send_row(base.selected, t, k);
  const Vec rows = randn(t * k * h, rng), R = randn(t * h, rng);
  const Buffer bp = c.upload(kF32, probs), sel = c.alloc(kI32, t * k), w = c.alloc(kF32, t * k), ps = c.alloc(kF32, t),
               cnt = c.alloc(kI64, e), frac = c.alloc(kF32, e), aux = c.alloc(kF64, 1);
  const Buffer br = c.upload(kF32, rows), bs = c.upload_i64(send), bx = c.alloc(kF32, t * h), bR = c.upload(kF32, R);
  auto objective = [&](const Vec& p) {
    c.put(bp, p);
    c.k().fill(aux, 0.0);
    c.k().moe_topk(bp, sel, w, ps, cnt, t, e, k);
    c.k().moe_aux_loss(bp, cnt, frac, aux, t, e, k);
    c.k().moe_combine(br, bs, w, bx, t, k, h, false);
    REQUIRE(c.get_i32(sel) == base.selected);  // the perturbation must not change the routing
    const Vec x = c.get(bx);
    double sum = 0;
    for (std::size_t i = 0; i < x.size(); ++i) sum += static_cast<double>(x[i]) * R[i];
    return sum + aux_scale * c.get_f64(aux)[0];
  };
  static_cast<void>(objective(probs));  // fills weight, psum and fraction at the base point
  const Buffer grad_rows = c.alloc(kF32, t * k * h), dweight = c.alloc(kF32, t * k), dp = c.alloc(kF32, t * e);
  c.k().moe_combine_backward(bR, br, bs, w, grad_rows, dweight, t, k, h);
  // d(aux)/dP[t][e] = E fraction[e] / t, so the aux term's coefficient per probability is aux_scale E / t.
  const float aux_coef = static_cast<float>(aux_scale * static_cast<double>(e) / static_cast<double>(t));
  c.k().moe_router_backward(dweight, w, sel, ps, frac, aux_coef, dp, t, e, k);
  const Vec grad = c.get(dp);
  check_finite_differences("moe_router_backward", "t,E,k,h 6x5x2x3 with aux", probs, grad, objective, 1e-3, 5e-3);
  c.require_ok();
}

struct Grouping {
  I64 order, offsets;
  std::int64_t live = 0;
};
// Rows of `sources` ranks, each sorted by its local experts: grouped by (expert, source, arrival).
Grouping reference_group(const I64& counts, std::int64_t sources, std::int64_t local) {
  Grouping g;
  I64 source_base(sz(sources), 0);
  for (std::int64_t s = 1; s < sources; ++s) {
    source_base[sz(s)] = source_base[sz(s - 1)];
    for (std::int64_t l = 0; l < local; ++l) source_base[sz(s)] += counts[sz((s - 1) * local + l)];
  }
  for (std::int64_t l = 0; l < local; ++l) {
    g.offsets.push_back(static_cast<std::int64_t>(g.order.size()));
    for (std::int64_t s = 0; s < sources; ++s) {
      std::int64_t first = source_base[sz(s)];
      for (std::int64_t l2 = 0; l2 < l; ++l2) first += counts[sz(s * local + l2)];
      for (std::int64_t a = 0; a < counts[sz(s * local + l)]; ++a) g.order.push_back(first + a);
    }
  }
  g.live = static_cast<std::int64_t>(g.order.size());
  g.offsets.push_back(g.live);
  return g;
}

TEST_CASE("kernels moe_group and moe_ungroup regroup received rows by expert and back", "[kernels]") {
  std::mt19937 rng(607);
  struct Case {
    std::int64_t sources, local, h;
    I64 counts;
  };
  const Case cases[] = {
      {3, 4, 5, {2, 0, 3, 1, 0, 0, 4, 2, 5, 1, 0, 0}},  // some counts zero, expert 1 nearly empty
      {2, 3, 1, {0, 0, 0, 3, 2, 1}},                    // source 0 sends nothing
      {1, 2, 19, {4, 3}},
      {4, 1, 7, {1, 0, 6, 2}},
      {2, 2, 3, {0, 0, 0, 0}},  // nothing live
  };
  for (ScalarType ty : kTensorTypes) {
    Ctx c;
    for (const Case& cs : cases) {
      const Grouping g = reference_group(cs.counts, cs.sources, cs.local);
      const std::int64_t cap = g.live + 3;  // capacity past the live rows
      const std::string dims = "sources,local,h " + shape_str({cs.sources, cs.local, cs.h}) + " live " +
                               std::to_string(g.live) + " of " + std::to_string(cap);
      const Vec recv = rand_t(ty, cap * cs.h, rng), grouped0 = rand_t(ty, cap * cs.h, rng);
      const Buffer br = c.upload(ty, recv), bc = c.upload_i64(cs.counts), bg = c.upload(ty, grouped0);
      const Buffer order = c.upload_i64(I64(sz(cap), -1)), offsets = c.upload_i64(I64(sz(cs.local + 1), -1));
      c.k().moe_group(br, bc, bg, order, offsets, cs.sources, cs.local, cs.h);
      const Vec grouped = c.get(bg);
      I64 got_order = c.get_i64(order);
      got_order.resize(sz(g.live));  // order past the live rows is unspecified
      expect_equal("moe_group", "int64", dims + ": offsets", c.get_i64(offsets), g.offsets);
      expect_equal("moe_group", "int64", dims + ": order", got_order, g.order);
      Vec want = grouped0;  // rows past the live ones untouched
      for (std::int64_t p = 0; p < g.live; ++p)
        for (std::int64_t j = 0; j < cs.h; ++j) want[sz(p * cs.h + j)] = recv[sz(g.order[sz(p)] * cs.h + j)];
      expect_equal("moe_group", tname(ty), dims + ": grouped rows (past the live rows untouched)", grouped, want);

      // ungroup(group(x)) = x on the live rows; the other rows of out stay.
      const Vec out0 = rand_t(ty, cap * cs.h, rng);
      const Buffer out = c.upload(ty, out0);
      c.k().moe_ungroup(bg, order, offsets, out, cs.local, cs.h);
      Vec want_out = out0;
      for (std::int64_t r = 0; r < g.live; ++r)
        for (std::int64_t j = 0; j < cs.h; ++j) want_out[sz(r * cs.h + j)] = recv[sz(r * cs.h + j)];
      expect_equal("moe_ungroup", tname(ty), dims + ": ungroup(group(x)) = x, the rest untouched", c.get(out),
                   want_out);

      // Another width (an expert's output rows): out[order[p]] = grouped[p] for p < live.
      const std::int64_t w2 = cs.h + 2;
      const Vec g2 = rand_t(ty, cap * w2, rng), o2 = rand_t(ty, cap * w2, rng);
      const Buffer bg2 = c.upload(ty, g2), bo2 = c.upload(ty, o2);
      c.k().moe_ungroup(bg2, order, offsets, bo2, cs.local, w2);
      Vec want2 = o2;
      for (std::int64_t p = 0; p < g.live; ++p)
        for (std::int64_t j = 0; j < w2; ++j) want2[sz(g.order[sz(p)] * w2 + j)] = g2[sz(p * w2 + j)];
      expect_equal("moe_ungroup", tname(ty), dims + ": width " + std::to_string(w2), c.get(bo2), want2);
    }
    c.require_ok();
  }
}

TEST_CASE("kernels sum_counts adds each row of counts times a multiplier", "[kernels]") {
  Ctx c;
  std::mt19937 rng(608);
  std::uniform_int_distribution<std::int64_t> dist(0, 9);
  for (const auto& [n, local, mult] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{3, 4, 1}, {5, 1, 7}, {1, 3, 4096}}) {
    I64 counts(sz(n * local));
    for (auto& x : counts) x = dist(rng);
    counts[0] = 0;
    const Buffer bc = c.upload_i64(counts), out = c.upload_i64(I64(sz(n + 1), -3));
    c.k().sum_counts(bc, out, n, local, mult);
    I64 want(sz(n + 1), -3);
    for (std::int64_t j = 0; j < n; ++j) {
      want[sz(j)] = 0;
      for (std::int64_t l = 0; l < local; ++l) want[sz(j)] += counts[sz(j * local + l)];
      want[sz(j)] *= mult;
    }
    expect_equal("sum_counts", "int64", "n,local,multiplier " + shape_str({n, local, mult}), c.get_i64(out), want);
  }
  c.require_ok();
}

TEST_CASE("kernels expert_gemm and expert_gemm_dw against per-group GEMMs with empty groups", "[kernels]") {
  std::mt19937 rng(609);
  struct Case {
    I64 offsets;
    std::int64_t w_rows, w_cols, w_gap;
  };
  const Case cases[] = {
      {{0, 5, 5, 17, 20}, 7, 9, 4},  // group 1 empty
      {{0, 0, 3, 3}, 17, 1, 0},      // first and last groups empty
      {{0, 33}, 5, 67, 1},           // one group
  };
  for (ScalarType ty : kTensorTypes) {
    Ctx c;
    for (const Case& cs : cases) {
      const std::int64_t groups = static_cast<std::int64_t>(cs.offsets.size()) - 1, live = cs.offsets.back();
      const std::int64_t cap = live + 3, stride = cs.w_rows * cs.w_cols + cs.w_gap;
      const std::int64_t wn = (groups - 1) * stride + cs.w_rows * cs.w_cols;
      const Vec W = rand_t(ty, wn, rng);
      const Buffer bw = c.upload(ty, W), off = c.upload_i64(cs.offsets);
      auto group_of = [&](std::int64_t r) {
        std::int64_t g = 0;
        while (g + 1 < groups && r >= cs.offsets[sz(g + 1)]) ++g;
        return g;
      };
      for (bool trans : {false, true})
        for (bool acc : {false, true}) {
          const std::int64_t in_w = trans ? cs.w_cols : cs.w_rows, out_w = trans ? cs.w_rows : cs.w_cols;
          const Vec a = rand_t(ty, cap * in_w, rng), c0 = rand_t(ty, cap * out_w, rng);
          ExpertGemmArgs args;
          args.a = c.upload(ty, a), args.w = bw, args.c = c.upload(ty, c0), args.offsets = off;
          args.groups = groups, args.w_rows = cs.w_rows, args.w_cols = cs.w_cols, args.w_stride = stride;
          args.trans_w = trans, args.accumulate = acc;
          c.k().expert_gemm(args);
          Vec got = c.get(args.c);
          got.resize(sz(live * out_w));  // rows past the live ones belong to no expert
          DVec ref(sz(live * out_w));
          for (std::int64_t r = 0; r < live; ++r) {
            const std::int64_t g = group_of(r);
            for (std::int64_t j = 0; j < out_w; ++j) {
              double s = acc ? c0[sz(r * out_w + j)] : 0.0;
              for (std::int64_t i = 0; i < in_w; ++i) {
                const double wv = trans ? W[sz(g * stride + j * cs.w_cols + i)] : W[sz(g * stride + i * cs.w_cols + j)];
                s += static_cast<double>(a[sz(r * in_w + i)]) * wv;
              }
              ref[sz(r * out_w + j)] = s;
            }
          }
          const std::string what = "groups " + std::to_string(groups) + " W " + shape_str({cs.w_rows, cs.w_cols}) +
                                   (trans ? " trans_w" : "") + (acc ? " accumulate" : "");
          expect_close("expert_gemm", tname(ty), what, got, ref, tol(ty, ty, in_w));
        }
      // dW_g += a_g^T c_g, into a gradient of the same type or fp32; gaps and empty groups stay.
      for (ScalarType gt : {ty, kF32}) {
        const Vec a = rand_t(ty, cap * cs.w_rows, rng), cc = rand_t(ty, cap * cs.w_cols, rng);
        const Vec dw0 = rand_t(gt, wn, rng, 0.5);
        ExpertGemmArgs args;
        args.a = c.upload(ty, a), args.c = c.upload(ty, cc), args.w = c.upload(gt, dw0), args.offsets = off;
        args.groups = groups, args.w_rows = cs.w_rows, args.w_cols = cs.w_cols, args.w_stride = stride;
        args.accumulate = true;
        c.k().expert_gemm_dw(args);
        DVec ref = to_d(dw0);
        for (std::int64_t r = 0; r < live; ++r) {
          const std::int64_t g = group_of(r);
          for (std::int64_t i = 0; i < cs.w_rows; ++i)
            for (std::int64_t j = 0; j < cs.w_cols; ++j)
              ref[sz(g * stride + i * cs.w_cols + j)] +=
                  static_cast<double>(a[sz(r * cs.w_rows + i)]) * cc[sz(r * cs.w_cols + j)];
        }
        expect_close("expert_gemm_dw", tname(ty, gt),
                     "groups " + std::to_string(groups) + " W " + shape_str({cs.w_rows, cs.w_cols}), c.get(args.w), ref,
                     tol(ty, gt, live));
        if (ty == kF32) break;
      }
    }
    c.require_ok();
  }
}

// A backend whose matrix library takes sizes from the host (the CUDA backend's cuBLAS) runs a grouped GEMM as
// the products expert_products.h lists: run through matmul, they must give expert_gemm's results.
TEST_CASE("kernels expert_products: one matmul per expert with rows gives expert_gemm and expert_gemm_dw",
          "[kernels]") {
  std::mt19937 rng(613);
  const I64 offsets = {0, 0, 6, 6, 13, 13};  // empty first, middle and last experts
  const std::int64_t groups = 5, live = 13, cap = live + 2, w_rows = 5, w_cols = 3, stride = w_rows * w_cols + 2;
  const std::int64_t wn = (groups - 1) * stride + w_rows * w_cols;
  Ctx c;
  const Buffer off = c.upload_i64(offsets), bw = c.upload(kF32, randn(wn, rng));
  auto run_products = [&](const Result<std::vector<MatmulArgs>>& products, std::size_t expected) {
    REQUIRE(products.ok());
    CHECK(products->size() == expected);  // the two experts with rows
    for (const MatmulArgs& p : *products) c.k().matmul(p);
  };
  for (bool trans : {false, true})
    for (bool acc : {false, true}) {
      const std::int64_t in_w = trans ? w_cols : w_rows, out_w = trans ? w_rows : w_cols;
      const Vec a = randn(cap * in_w, rng), c0 = randn(cap * out_w, rng);
      ExpertGemmArgs args;
      args.a = c.upload(kF32, a), args.w = bw, args.offsets = off;
      args.groups = groups, args.w_rows = w_rows, args.w_cols = w_cols, args.w_stride = stride;
      args.trans_w = trans, args.accumulate = acc;
      ExpertGemmArgs by_products = args;
      args.c = c.upload(kF32, c0), by_products.c = c.upload(kF32, c0);
      c.k().expert_gemm(args);
      run_products(expert_products(by_products, offsets.data()), 2);
      // Rows past the live ones are the same too: neither writes them.
      expect_close("expert_products", "fp32", std::string(trans ? "trans_w" : "W") + (acc ? " accumulate" : ""),
                   c.get(by_products.c), to_d(c.get(args.c)), tol(kF32, kF32, in_w));
    }
  const Vec dw0 = randn(wn, rng);
  ExpertGemmArgs args;
  args.a = c.upload(kF32, randn(cap * w_rows, rng)), args.c = c.upload(kF32, randn(cap * w_cols, rng));
  args.offsets = off, args.groups = groups, args.w_rows = w_rows, args.w_cols = w_cols, args.w_stride = stride;
  ExpertGemmArgs by_products = args;
  args.w = c.upload(kF32, dw0), by_products.w = c.upload(kF32, dw0);
  c.k().expert_gemm_dw(args);
  run_products(expert_dw_products(by_products, offsets.data()), 2);
  expect_close("expert_products", "fp32", "dW", c.get(by_products.w), to_d(c.get(args.w)), tol(kF32, kF32, live));
  c.require_ok();

  // Offsets that decrease or run past the rows are refused, naming the offset.
  const I64 decreasing = {0, 6, 4, 8, 13, 13}, past = {0, 0, 6, 6, 13, cap + 1};
  const auto bad = expert_products(args, decreasing.data());
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("expert offset 2 is 4, outside [6, "));
  const auto bad_dw = expert_dw_products(args, past.data());
  REQUIRE_FALSE(bad_dw.ok());
  CHECK_THAT(bad_dw.status().message(), Catch::Contains("expert offset 5 is 16"));
}

// The MoE expert stage as MoeBlock runs it: moe_group writes the offsets on the device, and the expert GEMMs read
// them straight after (the CUDA backend copies them to the host at moe_group and reuses that copy). A second
// grouping with other counts into the same offsets, and a GEMM on offsets grouped before another buffer's
// grouping, must each use their own offsets.
TEST_CASE("kernels expert_gemm on the offsets moe_group just wrote, regrouped and interleaved", "[kernels]") {
  std::mt19937 rng(617);
  const std::int64_t sources = 2, local = 3, h = 4, n = 3, stride = h * n, cap = 12;
  const I64 counts[] = {{2, 0, 3, 1, 1, 0}, {0, 4, 1, 0, 0, 2}};
  Ctx c;
  const Vec W = randn(local * stride, rng), recv = randn(cap * h, rng);
  const Buffer bw = c.upload(kF32, W), br = c.upload(kF32, recv);
  const Buffer bc[] = {c.upload_i64(counts[0]), c.upload_i64(counts[1])};
  const Buffer grouped[] = {c.alloc(kF32, cap * h), c.alloc(kF32, cap * h)};
  const Buffer order[] = {c.alloc(ScalarType::kInt64, cap), c.alloc(ScalarType::kInt64, cap)};
  const Buffer offsets[] = {c.alloc(ScalarType::kInt64, local + 1), c.alloc(ScalarType::kInt64, local + 1)};
  const Buffer out = c.alloc(kF32, cap * n);
  // out = grouped rows times their expert's W, against the reference grouping of `which` counts.
  auto check = [&](int which, int buffers, const std::string& what) {
    ExpertGemmArgs args;
    args.a = grouped[buffers], args.w = bw, args.c = out, args.offsets = offsets[buffers];
    args.groups = local, args.w_rows = h, args.w_cols = n, args.w_stride = stride;
    c.k().expert_gemm(args);
    const Grouping g = reference_group(counts[which], sources, local);
    DVec ref(sz(g.live * n));
    for (std::int64_t e = 0; e < local; ++e)
      for (std::int64_t p = g.offsets[sz(e)]; p < g.offsets[sz(e + 1)]; ++p)
        for (std::int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (std::int64_t i = 0; i < h; ++i)
            acc += static_cast<double>(recv[sz(g.order[sz(p)] * h + i)]) * W[sz(e * stride + i * n + j)];
          ref[sz(p * n + j)] = acc;
        }
    Vec got = c.get(out);
    got.resize(sz(g.live * n));
    expect_close("expert_gemm", "fp32", what, got, ref, tol(kF32, kF32, h));
  };
  c.k().moe_group(br, bc[0], grouped[0], order[0], offsets[0], sources, local, h);
  check(0, 0, "just grouped");
  c.k().moe_group(br, bc[1], grouped[0], order[0], offsets[0], sources, local, h);
  check(1, 0, "regrouped with other counts into the same offsets");
  c.k().moe_group(br, bc[0], grouped[0], order[0], offsets[0], sources, local, h);
  c.k().moe_group(br, bc[1], grouped[1], order[1], offsets[1], sources, local, h);
  check(0, 0, "grouped before another buffer's grouping");
  c.require_ok();
}

TEST_CASE("kernels expert_gemm input gradient and expert_gemm_dw match finite differences in fp32 with empty groups",
          "[kernels]") {
  std::mt19937 rng(611);
  const std::int64_t w_rows = 4, w_cols = 3, gap = 2, stride = w_rows * w_cols + gap;
  const I64 cases[] = {{0, 3, 3, 7}, {0, 0, 5, 5}};  // group 1 empty; first and last groups empty
  for (const I64& offsets : cases) {
    Ctx c;
    const std::int64_t groups = static_cast<std::int64_t>(offsets.size()) - 1, live = offsets.back();
    const std::int64_t cap = live + 2, wn = (groups - 1) * stride + w_rows * w_cols;
    const Buffer off = c.upload_i64(offsets);
    std::int64_t empty = 0;  // an empty group
    while (offsets[sz(empty + 1)] != offsets[sz(empty)]) ++empty;
    for (bool trans : {false, true}) {
      // c = a op(W): dL/da = R op(W)^T (expert_gemm with the other trans_w), dL/dW_g = a_g^T R_g (trans: R_g^T a_g).
      const std::int64_t in_w = trans ? w_cols : w_rows, out_w = trans ? w_rows : w_cols;
      const Vec a = randn(cap * in_w, rng), W = randn(wn, rng), R = randn(cap * out_w, rng), dw0 = randn(wn, rng);
      const Buffer ba = c.upload(kF32, a), bw = c.upload(kF32, W), bR = c.upload(kF32, R);
      const Buffer da = c.alloc(kF32, cap * in_w), dw = c.upload(kF32, dw0);
      c.k().fill(da, 0.0);  // rows past the live ones are not written; their finite differences are 0
      ExpertGemmArgs args;
      args.offsets = off, args.groups = groups, args.w_rows = w_rows, args.w_cols = w_cols, args.w_stride = stride;
      ExpertGemmArgs dx_args = args;
      dx_args.a = bR, dx_args.w = bw, dx_args.c = da, dx_args.trans_w = !trans;
      c.k().expert_gemm(dx_args);
      ExpertGemmArgs dw_args = args;
      dw_args.a = trans ? bR : ba, dw_args.c = trans ? ba : bR, dw_args.w = dw, dw_args.accumulate = true;
      c.k().expert_gemm_dw(dw_args);
      const Vec g_a = c.get(da), g_w = added(c.get(dw), dw0);
      const Buffer pa = c.alloc(kF32, cap * in_w), pw = c.alloc(kF32, wn), pc = c.alloc(kF32, cap * out_w);
      c.k().fill(pc, 0.0);
      auto objective = [&](const Vec& a2, const Vec& w2) {
        c.put(pa, a2), c.put(pw, w2);
        ExpertGemmArgs f = args;
        f.a = pa, f.w = pw, f.c = pc, f.trans_w = trans;
        c.k().expert_gemm(f);
        return dot_r(c.get(pc), R);
      };
      std::string what = "offsets";
      for (std::int64_t o : offsets) what += " " + std::to_string(o);
      what += " W " + shape_str({w_rows, w_cols}) + (trans ? " trans_w" : "");
      // Forced: a row past the live ones; an element of the empty group's W and one of a gap (gradient 0).
      check_gradient("expert_gemm", what + ": da by expert_gemm with " + (trans ? "W" : "W^T"), a, g_a,
                     [&](const Vec& v) { return objective(v, W); }, 0.1, 1e-4, rng, 6, {sz(live * in_w + 1)});
      check_gradient("expert_gemm_dw", what + ": dW (accumulated)", W, g_w,
                     [&](const Vec& v) { return objective(a, v); }, 0.1, 2e-5, rng, 6,
                     {sz(empty * stride + 1), sz(w_rows * w_cols + 1)});
    }
    c.require_ok();
  }
}

// ============================================================================================================
// Argument checks
// ============================================================================================================

// A bad call makes status() an error naming the kernel (and the backend); later calls on the same Kernels do
// nothing. A second Kernels on the same stream reads the results.
void expect_rejected(Ctx& c, const std::string& kernel, const std::string& buffer_name) {
  const Status& st = c.k().status();
  INFO("status after a bad " << kernel << " call: " << st.message());
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kInvalidInput);
  CHECK(st.message().find(kernel) != std::string::npos);
  CHECK(st.message().find(buffer_name) != std::string::npos);
  CHECK(st.message().find(c.k().backend()) != std::string::npos);
  // Later calls do nothing: a fill and a copy_from_host are skipped, the first error stays.
  const std::string first = st.message();
  std::unique_ptr<Kernels> reader = env().device->create_kernels(c.stream());
  REQUIRE(reader != nullptr);
  const Buffer probe = c.alloc(kF32, 3);
  Vec ones = {1.0f, 1.0f, 1.0f};
  reader->copy_from_host(ones.data(), probe);
  REQUIRE(c.stream().synchronize().ok());
  c.k().fill(probe, 5.0);
  Vec twos = {2.0f, 2.0f, 2.0f};
  c.k().copy_from_host(twos.data(), probe.slice(0, 1));
  c.k().scale(c.alloc(kI32, 2), 2.0f);  // another bad call (an integer buffer): must not replace the first error
  REQUIRE(c.stream().synchronize().ok());
  Vec got(3, 0.0f);
  reader->copy_to_host(probe, got.data());
  REQUIRE(c.stream().synchronize().ok());
  INFO("reader status: " << reader->status().message());
  REQUIRE(reader->status().ok());
  CHECK(got == ones);
  CHECK(c.k().status().message() == first);
  record("argument_checks", "-", 0.0, 0.0);
}

TEST_CASE("kernels matmul with a too small C is rejected and later calls do nothing", "[kernels]") {
  Ctx c;
  MatmulArgs a;
  a.m = 4, a.n = 5, a.k = 3;
  a.a = c.alloc(kF32, 12), a.lda = 3;
  a.b = c.alloc(kF32, 15), a.ldb = 5;
  a.c = c.alloc(kF32, 19), a.ldc = 5;  // needs 20
  c.k().matmul(a);
  expect_rejected(c, "matmul", "C");
}

TEST_CASE("kernels rmsnorm with a bf16 rstd is rejected", "[kernels]") {
  Ctx c;
  const Buffer x = c.alloc(kF32, 12), w = c.alloc(kF32, 4), y = c.alloc(kF32, 12), rstd = c.alloc(kBf16, 3);
  c.k().rmsnorm_forward(x, w, y, rstd, 3, 4);
  expect_rejected(c, "rmsnorm_forward", "rstd");
}

TEST_CASE("kernels cross_entropy with int64 targets is rejected", "[kernels]") {
  Ctx c;
  const Buffer logits = c.alloc(kF32, 14), targets = c.alloc(kI64, 2), loss = c.alloc(kF64, 1);
  const Buffer reserve = cross_entropy_reserve_buffer(c, 2, 7);
  c.k().cross_entropy_forward(logits, targets, reserve, loss, 2, 7);
  expect_rejected(c, "cross_entropy_forward", "targets");
}

TEST_CASE("kernels attention, adamw, sum_squares and moe_topk reject bad arguments", "[kernels]") {
  {
    Ctx c;
    const AttentionShape s{1, 3, 2, 1, 4};
    const Buffer q = c.alloc(kF32, 24), k = c.alloc(kF32, 12), v = c.alloc(kF32, 12), out = c.alloc(kF32, 24);
    const Buffer lse = c.alloc(kF32, 5);  // needs 6
    c.k().attention_forward(s, q, k, v, out, lse, Buffer{});
    expect_rejected(c, "attention_forward", "lse");
  }
  {
    Ctx c;
    AdamWHyper h;
    h.lr = 1e-3;
    h.coef = c.upload(kF32, {1.0f});
    c.sync();
    AdamWTensor t;
    t.param = c.alloc(kBf16, 8), t.master = c.alloc(kF32, 7), t.grad = c.alloc(kBf16, 8);
    t.m = c.alloc(kF32, 8), t.v = c.alloc(kF32, 8);
    c.k().adamw(h, {t});
    expect_rejected(c, "adamw", "master");
  }
  {
    Ctx c;
    const Buffer x = c.alloc(kF32, 8), acc = c.alloc(kF64, 1);
    c.k().sum_squares(x, 0, acc);
    expect_rejected(c, "sum_squares", "replicas");
  }
  {
    Ctx c;
    const Buffer probs = c.alloc(kF32, 8), sel = c.alloc(kI32, 4), w = c.alloc(kF32, 4), ps = c.alloc(kF32, 2);
    const Buffer cnt = c.alloc(kI32, 4);  // must be int64
    c.k().moe_topk(probs, sel, w, ps, cnt, 2, 4, 2);
    expect_rejected(c, "moe_topk", "expert_count");
  }
}

}  // namespace
}  // namespace hzp::runtime
