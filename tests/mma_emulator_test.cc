// The tensor-core attention kernels (runtime/backends/cuda/flash_mma_kernels.h) run on the CPU by
// tests/mma_emulator.h, against causal GQA attention in fp64: forward (out, lse), dQ, and dK with dV. The GPU
// tests need a GPU, which CI has not; this checks what a CPU can: the fragment layouts, the indexing and
// masking of every tile (sequences shorter than, equal to and past a tile, a single row), the softmax, the
// heads of a group, and the synchronisation of the double buffers (random thread order, cp.async landing
// late), with every shared and global access in range and every output written and no byte past them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "mma_emulator.h"
#include "runtime/backends/cpu/attention_reference.h"

namespace {

using hzp::runtime::Bf16;
using hzp::runtime::Fp16;
using hzp::runtime::cuda::AttentionGeometry;
namespace emu = hzp::test::emu;
namespace fm = hzp::runtime::cuda::flash_mma;

// A device buffer of n elements between two guard zones: the payload starts as NaN (all bits set), so an
// element a kernel never writes shows; the guards must come back untouched.
template <typename E>
struct Guarded {
  static constexpr std::size_t kGuard = 64;  // elements; a multiple of 16 bytes keeps the payload aligned
  static constexpr unsigned char kPattern = 0xa5;
  std::vector<E> all;
  std::size_t n;
  explicit Guarded(std::size_t count) : all(count + 2 * kGuard), n(count) {
    std::memset(all.data(), kPattern, all.size() * sizeof(E));
    std::memset(data(), 0xff, n * sizeof(E));
  }
  E* data() { return all.data() + kGuard; }
  const E* data() const { return all.data() + kGuard; }
  bool guards_intact() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(all.data());
    const std::size_t guard = kGuard * sizeof(E), tail = (kGuard + n) * sizeof(E);
    for (std::size_t i = 0; i < guard; ++i)
      if (bytes[i] != kPattern || bytes[tail + i] != kPattern) return false;
    return true;
  }
};

struct Shape {
  bool bf16;
  int batch, seq, heads, kv_heads;
};

// Causal GQA attention and its gradients in fp64 on the rounded inputs; row-major [batch * seq x heads * D].
struct Reference {
  std::vector<double> out, lse, delta, dq, dk, dv;
};

Reference reference(const AttentionGeometry& g, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout) {
  const std::int64_t d = g.d;
  Reference r{std::vector<double>(q.size()),
              std::vector<double>(g.batch * g.heads * g.seq),
              std::vector<double>(g.batch * g.heads * g.seq),
              std::vector<double>(q.size()),
              std::vector<double>(k.size()),
              std::vector<double>(k.size())};
  auto qi = [&](std::int64_t b, std::int64_t i, std::int64_t h) { return (b * g.seq + i) * g.wq + h * d; };
  auto ki = [&](std::int64_t b, std::int64_t j, std::int64_t h) { return (b * g.seq + j) * g.wkv + h * d; };
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t h = 0; h < g.heads; ++h) {
      const std::int64_t kh = h / g.group;
      for (std::int64_t i = 0; i < g.seq; ++i) {
        // Scores of row i against keys 0..i, their log-sum-exp, the output row and delta = out . dout.
        std::vector<double> p(static_cast<std::size_t>(i + 1));
        double most = -INFINITY;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t c = 0; c < d; ++c) s += q[qi(b, i, h) + c] * k[ki(b, j, kh) + c];
          p[j] = s * g.scale;
          most = std::max(most, p[j]);
        }
        double sum = 0;
        for (double s : p) sum += std::exp(s - most);
        const double lse = most + std::log(sum);
        for (double& s : p) s = std::exp(s - lse);
        const std::int64_t stat = (b * g.heads + h) * g.seq + i;
        r.lse[stat] = lse;
        for (std::int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (std::int64_t j = 0; j <= i; ++j) o += p[j] * v[ki(b, j, kh) + c];
          r.out[qi(b, i, h) + c] = o;
          r.delta[stat] += o * dout[qi(b, i, h) + c];
        }
        // dS = P (dP - delta) with dP = dout V^T; dQ = scale dS K, dK = scale dS^T Q, dV = P^T dout.
        for (std::int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (std::int64_t c = 0; c < d; ++c) dp += dout[qi(b, i, h) + c] * v[ki(b, j, kh) + c];
          const double ds = p[j] * (dp - r.delta[stat]);
          for (std::int64_t c = 0; c < d; ++c) {
            r.dq[qi(b, i, h) + c] += g.scale * ds * k[ki(b, j, kh) + c];
            r.dk[ki(b, j, kh) + c] += g.scale * ds * q[qi(b, i, h) + c];
            r.dv[ki(b, j, kh) + c] += p[j] * dout[qi(b, i, h) + c];
          }
        }
      }
    }
  return r;
}

// max |x - ref| / max |ref| (floored at 0.01, for all-zero references); infinite if x has a non-finite value.
template <typename T>
double relative_error(const Guarded<std::uint16_t>& x, const std::vector<double>& ref) {
  double err = 0, scale = 1e-2;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double y = emu::to_float<T>(x.data()[i]);
    if (!std::isfinite(y)) return INFINITY;
    err = std::max(err, std::fabs(y - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return err / scale;
}

// Random 16-bit inputs, the three kernels on the emulator, each output against the reference.
template <typename T, int D>
void check(const Shape& s, unsigned seed) {
  const AttentionGeometry g = hzp::runtime::cuda::attention_geometry({s.batch, s.seq, s.heads, s.kv_heads, D});
  const auto nq = static_cast<std::size_t>(g.batch * g.seq * g.wq),
             nk = static_cast<std::size_t>(g.batch * g.seq * g.wkv),
             nstat = static_cast<std::size_t>(g.batch * g.heads * g.seq);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Guarded<std::uint16_t> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  std::vector<double> qd(nq), kd(nk), vd(nk), doutd(nq);
  auto fill = [&](Guarded<std::uint16_t>& x, std::vector<double>& xd, float sigma) {
    for (std::size_t i = 0; i < x.n; ++i) {
      x.data()[i] = emu::from_float<T>(sigma * normal(rng));
      xd[i] = emu::to_float<T>(x.data()[i]);
    }
  };
  fill(q, qd, 2.0f);  // peaked softmax rows, so a wrong mask or maximum shows
  fill(k, kd, 1.0f);
  fill(v, vd, 1.0f);
  fill(dout, doutd, 1.0f);
  const Reference ref = reference(g, qd, kd, vd, doutd);

  emu::reset(seed);
  for (auto* x : {&q, &k, &v, &dout})
    emu::machine().readable.emplace_back(reinterpret_cast<const char*>(x->data()),
                                         reinterpret_cast<const char*>(x->data() + x->n));
  // The backward kernels take the reference's lse and delta, so each kernel is checked on its own.
  Guarded<float> lse(nstat), lse_in(nstat), delta_in(nstat);
  for (std::size_t i = 0; i < nstat; ++i) {
    lse_in.data()[i] = static_cast<float>(ref.lse[i]);
    delta_in.data()[i] = static_cast<float>(ref.delta[i]);
  }
  const auto* qp = reinterpret_cast<const T*>(q.data());
  const auto* kp = reinterpret_cast<const T*>(k.data());
  const auto* vp = reinterpret_cast<const T*>(v.data());
  const auto* dop = reinterpret_cast<const T*>(dout.data());
  const auto tiles = static_cast<unsigned>(fm::row_tiles(g.seq));
  const emu::Dim3 query_grid{tiles, static_cast<unsigned>(g.heads), static_cast<unsigned>(g.batch)};
  const emu::Dim3 key_grid{tiles, static_cast<unsigned>(g.kv_heads), static_cast<unsigned>(g.batch)};
  emu::launch(query_grid, fm::forward_bytes<T, D>(),
              [&] { fm::mma_forward_kernel<T, D>(qp, kp, vp, reinterpret_cast<T*>(out.data()), lse.data(), g); });
  emu::launch(query_grid, fm::dq_bytes<T, D>(), [&] {
    fm::mma_dq_kernel<T, D>(qp, kp, vp, dop, lse_in.data(), delta_in.data(), reinterpret_cast<T*>(dq.data()), g);
  });
  emu::launch(key_grid, fm::dkv_bytes<T, D>(), [&] {
    fm::mma_dkv_kernel<T, D, fm::dkv_queries<D>()>(qp, kp, vp, dop, lse_in.data(), delta_in.data(),
                                                   reinterpret_cast<T*>(dk.data()), reinterpret_cast<T*>(dv.data()), g);
  });
  REQUIRE(emu::machine().error == "");
  CHECK(emu::machine().bank_conflicts == 0);  // rows of D + 8 elements: the 8 rows of a phase on 8 bank groups

  double lse_error = 0;
  for (std::size_t i = 0; i < nstat; ++i)
    lse_error = std::max(lse_error, std::fabs(static_cast<double>(lse.data()[i]) - ref.lse[i]));
  // Products of T-rounded probabilities and operands, summed in fp32: bf16 keeps 8 bits, fp16 11.
  const double tolerance = std::is_same_v<T, Bf16> ? 3e-2 : 5e-3;
  CHECK(relative_error<T>(out, ref.out) < tolerance);
  CHECK(lse_error < 1e-3);  // NaN fails too
  CHECK(relative_error<T>(dq, ref.dq) < tolerance);
  CHECK(relative_error<T>(dk, ref.dk) < tolerance);
  CHECK(relative_error<T>(dv, ref.dv) < tolerance);
  for (const auto* x : {&out, &dq, &dk, &dv}) CHECK(x->guards_intact());
  CHECK(lse.guards_intact());
}

// PASA's forward (fp16) against the CPU reference's PASA on the same inputs: the kernel follows its
// recurrences and roundings, so the two differ only where fp32 sums in another order round to another fp16.
// `bias` is added to every query and key element: a common bias along the sequence is what makes standard
// fp16 attention overflow (docs/pasa.md) and what PASA's shift removes.
template <int D>
void check_pasa(const Shape& s, float bias, unsigned seed) {
  const AttentionGeometry g = hzp::runtime::cuda::attention_geometry({s.batch, s.seq, s.heads, s.kv_heads, D});
  const auto nq = static_cast<std::size_t>(g.batch * g.seq * g.wq),
             nk = static_cast<std::size_t>(g.batch * g.seq * g.wkv),
             nstat = static_cast<std::size_t>(g.batch * g.heads * g.seq);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Guarded<std::uint16_t> q(nq), k(nk), v(nk), out(nq);
  std::vector<float> qf(nq), kf(nk), vf(nk);
  auto fill = [&](Guarded<std::uint16_t>& x, std::vector<float>& xf, float shift) {
    for (std::size_t i = 0; i < x.n; ++i) {
      x.data()[i] = emu::from_float<Fp16>(shift + normal(rng));
      xf[i] = emu::to_float<Fp16>(x.data()[i]);
    }
  };
  fill(q, qf, bias);
  fill(k, kf, bias);
  fill(v, vf, 0.0f);
  std::vector<float> ref_out(nq), ref_lse(nstat);
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t h = 0; h < g.heads; ++h) {
      const std::size_t qo = static_cast<std::size_t>(b * g.seq * g.wq + h * D),
                        ko = static_cast<std::size_t>(b * g.seq * g.wkv + (h / g.group) * D);
      const hzp::runtime::reference::Head head{qf.data() + qo, kf.data() + ko, vf.data() + ko, g.seq, D, g.wq, g.wkv};
      hzp::runtime::reference::pasa_attention(head, hzp::runtime::ScalarType::kFp16,
                                              hzp::runtime::reference::kPasaBlock,
                                              hzp::runtime::reference::pasa_default_beta(), ref_out.data() + qo, g.wq,
                                              ref_lse.data() + static_cast<std::size_t>((b * g.heads + h) * g.seq));
    }

  emu::reset(seed);
  for (auto* x : {&q, &k, &v})
    emu::machine().readable.emplace_back(reinterpret_cast<const char*>(x->data()),
                                         reinterpret_cast<const char*>(x->data() + x->n));
  Guarded<float> lse(nstat);
  const emu::Dim3 grid{static_cast<unsigned>(fm::row_tiles(g.seq)), static_cast<unsigned>(g.heads),
                       static_cast<unsigned>(g.batch)};
  emu::launch(grid, fm::pasa_forward_bytes<Fp16, D>(), [&] {
    fm::mma_pasa_forward_kernel<Fp16, D>(reinterpret_cast<const Fp16*>(q.data()),
                                         reinterpret_cast<const Fp16*>(k.data()),
                                         reinterpret_cast<const Fp16*>(v.data()), reinterpret_cast<Fp16*>(out.data()),
                                         lse.data(), g, hzp::runtime::cuda::pasa_shift(D));
  });
  REQUIRE(emu::machine().error == "");
  CHECK(emu::machine().bank_conflicts == 0);
  double out_error = 0, out_scale = 1e-2, lse_error = 0;
  for (std::size_t i = 0; i < nq; ++i) {
    const double y = emu::to_float<Fp16>(out.data()[i]);
    out_error = std::isfinite(y) ? std::max(out_error, std::fabs(y - ref_out[i])) : INFINITY;
    out_scale = std::max(out_scale, std::fabs(static_cast<double>(ref_out[i])));
  }
  for (std::size_t i = 0; i < nstat; ++i) {
    const double x = lse.data()[i];
    lse_error =
        std::isfinite(x) ? std::max(lse_error, std::fabs(x - ref_lse[i]) / std::max(1.0, std::fabs(x))) : INFINITY;
  }
  INFO("out error " << out_error / out_scale << ", lse error " << lse_error);
  CHECK(out_error / out_scale < 5e-3);
  // The recovered lse adds c = beta / (1 - beta) ~ 63 times the fp16 running average: one fp16 ulp of a block's
  // pseudo-average, where the two sum in another order, moves it by ~1e-3.
  CHECK(lse_error < 5e-3);
  CHECK(out.guards_intact());
  CHECK(lse.guards_intact());
}

template <int D>
void check_all(const std::vector<Shape>& shapes) {
  unsigned seed = 1;
  for (const Shape& s : shapes) {
    INFO((s.bf16 ? "bf16" : "fp16") << " D " << D << " batch " << s.batch << " seq " << s.seq << " heads " << s.heads
                                    << " kv_heads " << s.kv_heads);
    if (s.bf16)
      check<Bf16, D>(s, seed++);
    else
      check<Fp16, D>(s, seed++);
  }
}

// Under AddressSanitizer the emulation is many times slower (and fibers on ucontext only partly supported):
// one shape per head dimension there, the rest in the ordinary build.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

}  // namespace

// Shapes: a single row; sequences one short of, exactly, and one past a tile of 64, and two tiles and a bit;
// groups of 1, 2 and 4 query heads per kv head; batch 2 (the batch offset of every pointer).
TEST_CASE("flash_mma kernels on the emulator match fp64 attention at head dim 64", "[cuda][mma][emulator]") {
  std::vector<Shape> shapes = {{false, 1, 65, 2, 1}};
  if (!kSanitized)
    shapes.insert(shapes.end(), {{false, 1, 1, 2, 1}, {true, 1, 63, 4, 1}, {true, 1, 130, 4, 2}, {false, 2, 64, 2, 2}});
  check_all<64>(shapes);
}

TEST_CASE("flash_mma kernels on the emulator match fp64 attention at head dim 128", "[cuda][mma][emulator]") {
  std::vector<Shape> shapes = {{true, 1, 65, 2, 1}};
  if (!kSanitized)
    shapes.insert(shapes.end(), {{true, 1, 1, 1, 1}, {false, 1, 64, 4, 1}, {false, 2, 63, 2, 2}, {true, 1, 130, 4, 2}});
  check_all<128>(shapes);
}

// PASA: one block of 128 keys and a bit past it (the padded last block), a single row, groups, batch 2, and a
// bias of 30 on queries and keys (scores near 30^2 D: standard fp16 attention overflows there).
TEST_CASE("flash_mma PASA forward on the emulator matches the CPU reference's PASA", "[cuda][mma][emulator][pasa]") {
  struct Case {
    Shape shape;
    float bias;
  };
  std::vector<Case> cases = {{{false, 1, 130, 2, 1}, 30.0f}};
  if (!kSanitized)
    cases.insert(cases.end(),
                 {{{false, 1, 1, 1, 1}, 0.0f}, {{false, 2, 64, 4, 2}, 0.0f}, {{false, 1, 257, 2, 2}, 4.0f}});
  unsigned seed = 100;
  for (const Case& c : cases) {
    const Shape& s = c.shape;
    INFO("batch " << s.batch << " seq " << s.seq << " heads " << s.heads << " kv_heads " << s.kv_heads << " bias "
                  << c.bias);
    check_pasa<64>(s, c.bias, seed++);
    check_pasa<128>(s, c.bias, seed++);
  }
}
