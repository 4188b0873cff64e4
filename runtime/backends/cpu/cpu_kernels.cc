// The CPU reference kernels (cpu_kernels.h): runtime/device/kernels.h on host memory.
//
// Every kernel is written once over its storage type T (float, Bf16, Fp16): ld() widens an element to fp32,
// st<T>() rounds an fp32 result to T (identity for float), so the fp32 instantiation performs exactly the
// operations, in the same order, that the fp32-only kernels did before the interface existed.
#include "runtime/backends/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/backends/cpu/attention_reference.h"

namespace hzp::runtime {
namespace {

// --- Element access ---------------------------------------------------------------------------------------

inline float ld(float x) {
  return x;
}
inline float ld(Bf16 x) {
  return from_bf16(x);
}
inline float ld(Fp16 x) {
  return from_fp16(x);
}

template <typename T>
inline T st(float f);
template <>
inline float st<float>(float f) {
  return f;
}
template <>
inline Bf16 st<Bf16>(float f) {
  return to_bf16(f);
}
template <>
inline Fp16 st<Fp16>(float f) {
  return to_fp16(f);
}

// Calls f(T{}) with T the storage type of a tensor buffer.
template <typename F>
void on_type(ScalarType t, F&& f) {
  switch (t) {
    case ScalarType::kBf16:
      f(Bf16{});
      return;
    case ScalarType::kFp16:
      f(Fp16{});
      return;
    default:
      f(float{});
      return;
  }
}

// Two buffers' storage types (e.g. activations and gradients of different precisions).
template <typename F>
void on_types(ScalarType a, ScalarType b, F&& f) {
  on_type(a, [&](auto ta) { on_type(b, [&](auto tb) { f(ta, tb); }); });
}

// fp32 elements [0, n) of a tensor buffer, widened into `scratch` unless the buffer is fp32 already.
const float* widen(const Buffer& b, std::int64_t offset, std::int64_t n, std::vector<float>& scratch) {
  if (b.type == ScalarType::kFp32) return b.as<const float>() + offset;
  scratch.resize(static_cast<std::size_t>(n));
  on_type(b.type, [&](auto tag) {
    using T = decltype(tag);
    const T* p = b.as<const T>() + offset;
    for (std::int64_t i = 0; i < n; ++i) scratch[i] = ld(p[i]);
  });
  return scratch.data();
}

// Row-major sgemm (OpenBLAS) with sgemm's k == 0 behaviour: C scaled by beta.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Elements a [rows x cols] matrix with row stride ld spans.
std::int64_t span(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

// p[0..n) = softmax(l[0..n)) (fp32, p may be l); returns log(sum(exp(l))) in fp64, computed stably.
double softmax_row(const float* l, float* p, std::int64_t n) {
  const float mx = *std::max_element(l, l + n);
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(l[i] - mx);
    sum += p[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (std::int64_t i = 0; i < n; ++i) p[i] *= inv;
  return std::log(sum) + mx;
}

// The k largest of p[0..n) in descending order (ties: lower index first) into index[0..k): insertion into a
// sorted list of the best k so far; strict > keeps the lower index first.
void top_k(const float* p, std::int64_t n, std::int64_t k, std::int32_t* index) {
  std::int64_t filled = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    if (filled == k && !(p[j] > p[index[k - 1]])) continue;
    std::int64_t pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && p[j] > p[index[pos - 1]]) {
      index[pos] = index[pos - 1];
      --pos;
    }
    index[pos] = static_cast<std::int32_t>(j);
  }
}

class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(Stream& stream) : Kernels(stream) {}
  std::string backend() const override { return "cpu"; }

  std::int64_t attention_reserve(const AttentionShape& s) const override {
    if (s.algorithm == AttentionAlgorithm::kPasa) return 0;  // its backward works from the recovered lse
    return s.batch * s.heads * s.seq * s.seq;                // the probabilities
  }
  std::int64_t cross_entropy_reserve(std::int64_t rows, std::int64_t vocab) const override {
    return rows * vocab;  // the softmax
  }

 protected:
  // --- Memory -------------------------------------------------------------------------------------------------

  void do_fill(const Buffer& x, double value) override {
    switch (x.type) {
      case ScalarType::kFp64:
        std::fill_n(x.as<double>(), x.count, value);
        return;
      case ScalarType::kInt32:
        std::fill_n(x.as<std::int32_t>(), x.count, static_cast<std::int32_t>(value));
        return;
      case ScalarType::kInt64:
        std::fill_n(x.as<std::int64_t>(), x.count, static_cast<std::int64_t>(value));
        return;
      default:
        on_type(x.type, [&](auto tag) {
          using T = decltype(tag);
          std::fill_n(x.as<T>(), x.count, st<T>(static_cast<float>(value)));
        });
    }
  }

  void do_copy(const Buffer& src, const Buffer& dst) override {
    if (src.data != dst.data) std::memmove(dst.data, src.data, static_cast<std::size_t>(dst.bytes()));
  }

  void do_cast(const Buffer& src, const Buffer& dst) override {
    if (src.type == dst.type) return do_copy(src, dst);
    if (src.type == ScalarType::kFp64 || dst.type == ScalarType::kFp64) {
      // fp64 <-> a tensor type: through fp32 (a double is first rounded to float, then to 16 bits).
      std::vector<float> tmp(static_cast<std::size_t>(src.count));
      decode_floats(src.type, src.data, src.count, tmp.data());
      encode_floats(dst.type, tmp.data(), dst.count, dst.data);
      return;
    }
    on_types(src.type, dst.type, [&](auto ts, auto td) {
      using S = decltype(ts);
      using D = decltype(td);
      const S* in = src.as<const S>();
      D* out = dst.as<D>();
      for (std::int64_t i = 0; i < src.count; ++i) out[i] = st<D>(ld(in[i]));
    });
  }

  void do_copy_from_host(const void* src, const Buffer& dst) override {
    if (dst.count > 0) std::memmove(dst.data, src, static_cast<std::size_t>(dst.bytes()));
  }
  void do_copy_to_host(const Buffer& src, void* dst) override {
    if (src.count > 0) std::memmove(dst, src.data, static_cast<std::size_t>(src.bytes()));
  }

  // --- Element-wise, norms, the optimizer -----------------------------------------------------------------

  void do_scale(const Buffer& x, float alpha) override {
    if (x.type == ScalarType::kFp64) {
      for (std::int64_t i = 0; i < x.count; ++i) x.as<double>()[i] *= alpha;
      return;
    }
    on_type(x.type, [&](auto tag) {
      using T = decltype(tag);
      T* p = x.as<T>();
      for (std::int64_t i = 0; i < x.count; ++i) p[i] = st<T>(ld(p[i]) * alpha);
    });
  }

  void do_add(const Buffer& src, const Buffer& dst) override {
    on_types(src.type, dst.type, [&](auto ts, auto td) {
      using S = decltype(ts);
      using D = decltype(td);
      const S* a = src.as<const S>();
      D* b = dst.as<D>();
      for (std::int64_t i = 0; i < src.count; ++i) b[i] = st<D>(ld(b[i]) + ld(a[i]));
    });
  }

  void do_sum_squares(const Buffer& x, std::int64_t replicas, const Buffer& acc) override {
    double sum = 0;
    on_type(x.type, [&](auto tag) {
      using T = decltype(tag);
      const T* g = x.as<const T>();
      for (std::int64_t e = 0; e < x.count; ++e) {
        const float v = ld(g[e]);
        sum += static_cast<double>(v) * v;
      }
    });
    acc.as<double>()[0] += sum / static_cast<double>(replicas);
  }

  void do_clip_coefficient(const Buffer& norm_sq, double max_norm, double inv_loss_scale, const Buffer& norm,
                           const Buffer& coef) override {
    const double n = std::sqrt(static_cast<double>(norm_sq.as<const float>()[0])) * inv_loss_scale;
    norm.as<double>()[0] = n;
    const double clip = max_norm > 0 ? std::min(1.0, max_norm / (n + 1e-6)) : 1.0;
    coef.as<float>()[0] = static_cast<float>(clip * inv_loss_scale);
  }

  void do_adamw(const AdamWHyper& hp, const std::vector<AdamWTensor>& tensors) override {
    if (!hp.skip_if_nonfinite.empty() && !std::isfinite(hp.skip_if_nonfinite.as<const double>()[0])) return;
    const double b1 = hp.beta1, b2 = hp.beta2;
    const double c1 = 1 - std::pow(b1, static_cast<double>(hp.step));
    const double c2 = 1 - std::pow(b2, static_cast<double>(hp.step));
    const float coef = hp.coef.as<const float>()[0];
    for (const AdamWTensor& t : tensors) {
      const double decay = t.decay ? hp.lr * hp.weight_decay : 0.0;
      float* m = t.m.as<float>();
      float* v = t.v.as<float>();
      // The weights live in the master copy when there is one, else in the (fp32) parameter itself.
      auto update = [&](auto tp, auto tg, auto with_master) {
        using P = decltype(tp);
        using G = decltype(tg);
        P* p = t.param.as<P>();
        float* master = t.master.as<float>();
        const G* g = t.grad.as<const G>();
        for (std::int64_t e = 0; e < t.param.count; ++e) {
          const double grad = static_cast<double>(ld(g[e]) * coef);
          const double mm = b1 * m[e] + (1 - b1) * grad;
          const double vv = b2 * v[e] + (1 - b2) * grad * grad;
          m[e] = static_cast<float>(mm);
          v[e] = static_cast<float>(vv);
          double w = with_master ? master[e] : ld(p[e]);
          w -= decay * w;
          w -= hp.lr * (mm / c1) / (std::sqrt(vv / c2) + hp.eps);
          const float wf = static_cast<float>(w);
          if constexpr (with_master) master[e] = wf;
          p[e] = st<P>(wf);
        }
      };
      on_types(t.param.type, t.grad.type, [&](auto tp, auto tg) {
        if (t.master.empty())
          update(tp, tg, std::false_type{});
        else
          update(tp, tg, std::true_type{});
      });
    }
  }

  // --- Matmuls ----------------------------------------------------------------------------------------------

  void do_matmul(const MatmulArgs& a) override {
    const std::int64_t a_rows = a.trans_a ? a.k : a.m, a_cols = a.trans_a ? a.m : a.k;
    const std::int64_t b_rows = a.trans_b ? a.n : a.k, b_cols = a.trans_b ? a.k : a.n;
    for (std::int64_t i = 0; i < a.batch; ++i)
      gemm_any(a.trans_a, a.trans_b, a.m, a.n, a.k, a.alpha, a.a, i * a.stride_a, a.lda, a_rows, a_cols, a.b,
               i * a.stride_b, a.ldb, b_rows, b_cols, a.beta, a.c, i * a.stride_c, a.ldc);
  }

  // --- Embedding ----------------------------------------------------------------------------------------------

  void do_embedding_forward(const Buffer& table, const Buffer& ids, const Buffer& out, std::int64_t h) override {
    const std::int64_t vocab = table.count / h;
    const std::int32_t* id = ids.as<const std::int32_t>();
    const std::size_t row_bytes = static_cast<std::size_t>(h * scalar_bytes(table.type));
    for (std::int64_t t = 0; t < ids.count; ++t) {
      if (id[t] < 0 || id[t] >= vocab) return bad_id(id[t], vocab);
      std::memcpy(static_cast<char*>(out.data) + t * row_bytes,
                  static_cast<const char*>(table.data) + id[t] * row_bytes, row_bytes);
    }
  }

  // Rows of one id accumulate in token order in fp32, starting from the table's value, and are rounded once.
  void do_embedding_backward(const Buffer& dout, const Buffer& ids, const Buffer& dtable, std::int64_t h) override {
    const std::int64_t vocab = dtable.count / h;
    const std::int32_t* id = ids.as<const std::int32_t>();
    for (std::int64_t t = 0; t < ids.count; ++t)
      if (id[t] < 0 || id[t] >= vocab) return bad_id(id[t], vocab);
    on_types(dout.type, dtable.type, [&](auto td, auto tt) {
      using D = decltype(td);
      using W = decltype(tt);
      const D* dx = dout.as<const D>();
      W* table = dtable.as<W>();
      if constexpr (std::is_same_v<W, float>) {
        for (std::int64_t t = 0; t < ids.count; ++t) {
          float* row = table + static_cast<std::int64_t>(id[t]) * h;
          for (std::int64_t i = 0; i < h; ++i) row[i] += ld(dx[t * h + i]);
        }
      } else {
        // Tokens grouped by id (stable), each group summed into one fp32 row.
        order_.resize(static_cast<std::size_t>(ids.count));
        std::iota(order_.begin(), order_.end(), 0);
        std::stable_sort(order_.begin(), order_.end(), [&](std::int64_t a, std::int64_t b) { return id[a] < id[b]; });
        row_.resize(static_cast<std::size_t>(h));
        for (std::size_t g = 0; g < order_.size();) {
          const std::int32_t row_id = id[order_[g]];
          W* row = table + static_cast<std::int64_t>(row_id) * h;
          for (std::int64_t i = 0; i < h; ++i) row_[i] = ld(row[i]);
          for (; g < order_.size() && id[order_[g]] == row_id; ++g)
            for (std::int64_t i = 0; i < h; ++i) row_[i] += ld(dx[order_[g] * h + i]);
          for (std::int64_t i = 0; i < h; ++i) row[i] = st<W>(row_[i]);
        }
      }
    });
  }

  // --- RMSNorm ----------------------------------------------------------------------------------------------

  void do_rmsnorm_forward(const Buffer& xb, const Buffer& wb, const Buffer& yb, const Buffer& rstd, std::int64_t rows,
                          std::int64_t h) override {
    on_type(xb.type, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xb.as<const T>();
      const T* w = wb.as<const T>();
      T* y = yb.as<T>();
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * h;
        T* yr = y + r * h;
        double sum_sq = 0;
        for (std::int64_t i = 0; i < h; ++i) sum_sq += static_cast<double>(ld(xr[i])) * ld(xr[i]);
        const float s = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(h) + kNormEps));
        rstd.as<float>()[r] = s;
        for (std::int64_t i = 0; i < h; ++i) yr[i] = st<T>(ld(xr[i]) * s * ld(w[i]));
      }
    });
  }

  // With n = x * r (r = rstd): y = n * w, so dw += dy * n and dx = r * (dy * w) - r^3 / h * x * sum_i(dy_i w_i x_i).
  // dw accumulates over rows in fp32 from its stored value and is rounded once.
  void do_rmsnorm_backward(const Buffer& xb, const Buffer& wb, const Buffer& rstd, const Buffer& dyb, const Buffer& dxb,
                           const Buffer& dwb, std::int64_t rows, std::int64_t h, bool accumulate) override {
    on_types(xb.type, dwb.type, [&](auto tx, auto tw) {
      using T = decltype(tx);
      using W = decltype(tw);
      const T* x = xb.as<const T>();
      const T* w = wb.as<const T>();
      const T* dy = dyb.as<const T>();
      T* dx = dxb.as<T>();
      W* dw_out = dwb.as<W>();
      float* dw = nullptr;  // fp32: accumulate in place, as before; 16-bit: in an fp32 row, rounded at the end
      if constexpr (std::is_same_v<W, float>) {
        dw = dw_out;
      } else {
        row_.resize(static_cast<std::size_t>(h));
        for (std::int64_t i = 0; i < h; ++i) row_[i] = ld(dw_out[i]);
        dw = row_.data();
      }
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * h;
        const T* dyr = dy + r * h;
        T* dxr = dx + r * h;
        const float s = rstd.as<const float>()[r];
        double dot = 0;
        for (std::int64_t i = 0; i < h; ++i) {
          dot += static_cast<double>(ld(dyr[i])) * ld(w[i]) * ld(xr[i]);
          dw[i] += ld(dyr[i]) * ld(xr[i]) * s;
        }
        const float c = static_cast<float>(dot) * s * s * s / static_cast<float>(h);
        for (std::int64_t i = 0; i < h; ++i) {
          const float g = s * ld(dyr[i]) * ld(w[i]) - c * ld(xr[i]);
          dxr[i] = st<T>(accumulate ? ld(dxr[i]) + g : g);
        }
      }
      if constexpr (!std::is_same_v<W, float>)
        for (std::int64_t i = 0; i < h; ++i) dw_out[i] = st<W>(row_[i]);
    });
  }

  // --- Rotary positions ---------------------------------------------------------------------------------------

  void do_rope_tables(const Buffer& cos, const Buffer& sin, std::int64_t seq, std::int64_t d) override {
    const std::int64_t half = d / 2;
    for (std::int64_t t = 0; t < seq; ++t) {
      for (std::int64_t i = 0; i < half; ++i) {
        const double inv_freq = std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const double angle = static_cast<double>(t) * inv_freq;
        cos.as<float>()[t * half + i] = static_cast<float>(std::cos(angle));
        sin.as<float>()[t * half + i] = static_cast<float>(std::sin(angle));
      }
    }
  }

  // Rotates every head of every row by +angle, or by -angle (the transpose) when inverse.
  void do_rope(const Buffer& xb, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
               const Buffer& cos, const Buffer& sin, bool inverse) override {
    const std::int64_t half = d / 2;
    const float sign = inverse ? -1.0f : 1.0f;
    on_type(xb.type, [&](auto tag) {
      using T = decltype(tag);
      T* x = xb.as<T>();
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* c = cos.as<const float>() + (r % seq) * half;
        const float* s = sin.as<const float>() + (r % seq) * half;
        for (std::int64_t hd = 0; hd < heads; ++hd) {
          T* a = x + (r * heads + hd) * d;
          T* b = a + half;
          for (std::int64_t i = 0; i < half; ++i) {
            const float ai = ld(a[i]);
            const float bi = ld(b[i]);
            const float si = sign * s[i];
            a[i] = st<T>(ai * c[i] - bi * si);
            b[i] = st<T>(bi * c[i] + ai * si);
          }
        }
      }
    });
  }

  // --- SwiGLU ---------------------------------------------------------------------------------------------------

  static std::int64_t live_rows(std::int64_t rows, const Buffer& row_limit) {
    if (row_limit.empty()) return rows;
    return std::clamp<std::int64_t>(row_limit.as<const std::int64_t>()[0], 0, rows);
  }

  void do_swiglu_forward(const Buffer& gb, const Buffer& ub, const Buffer& ab, std::int64_t rows, std::int64_t width,
                         const Buffer& row_limit) override {
    const std::int64_t n = live_rows(rows, row_limit) * width;
    on_type(gb.type, [&](auto tag) {
      using T = decltype(tag);
      const T* gate = gb.as<const T>();
      const T* up = ub.as<const T>();
      T* act = ab.as<T>();
      for (std::int64_t i = 0; i < n; ++i) {
        const float g = ld(gate[i]);
        act[i] = st<T>(g / (1.0f + std::exp(-g)) * ld(up[i]));
      }
    });
  }

  // silu'(g) = sig(g) * (1 + g * (1 - sig(g))).
  void do_swiglu_backward(const Buffer& gb, const Buffer& ub, const Buffer& dab, const Buffer& dgb, const Buffer& dub,
                          std::int64_t rows, std::int64_t width, const Buffer& row_limit) override {
    const std::int64_t n = live_rows(rows, row_limit) * width;
    on_type(gb.type, [&](auto tag) {
      using T = decltype(tag);
      const T* gate = gb.as<const T>();
      const T* up = ub.as<const T>();
      const T* dact = dab.as<const T>();
      T* dgate = dgb.as<T>();
      T* dup = dub.as<T>();
      for (std::int64_t i = 0; i < n; ++i) {
        const float g = ld(gate[i]);
        const float sig = 1.0f / (1.0f + std::exp(-g));
        const float silu = g * sig;
        const float da = ld(dact[i]);
        const float u = ld(up[i]);
        dup[i] = st<T>(da * silu);
        dgate[i] = st<T>(da * u * sig * (1.0f + g * (1.0f - sig)));
      }
    });
  }

  // --- Softmax ----------------------------------------------------------------------------------------------------

  void do_softmax_rows(const Buffer& xb, const Buffer& pb, std::int64_t rows, std::int64_t n) override {
    on_types(xb.type, pb.type, [&](auto tx, auto tp) {
      using X = decltype(tx);
      using P = decltype(tp);
      for (std::int64_t r = 0; r < rows; ++r) {
        if constexpr (std::is_same_v<X, float> && std::is_same_v<P, float>) {
          softmax_row(xb.as<const float>() + r * n, pb.as<float>() + r * n, n);
        } else {
          row_.resize(static_cast<std::size_t>(n));
          const X* x = xb.as<const X>() + r * n;
          for (std::int64_t i = 0; i < n; ++i) row_[i] = ld(x[i]);
          softmax_row(row_.data(), row_.data(), n);
          P* p = pb.as<P>() + r * n;
          for (std::int64_t i = 0; i < n; ++i) p[i] = st<P>(row_[i]);
        }
      }
    });
  }

  void do_softmax_rows_backward(const Buffer& pb, const Buffer& dpb, const Buffer& dxb, std::int64_t rows,
                                std::int64_t n) override {
    on_types(pb.type, dxb.type, [&](auto tp, auto tx) {
      using P = decltype(tp);
      using X = decltype(tx);
      on_type(dpb.type, [&](auto td) {
        using D = decltype(td);
        for (std::int64_t r = 0; r < rows; ++r) {
          const P* p = pb.as<const P>() + r * n;
          const D* dp = dpb.as<const D>() + r * n;
          X* dx = dxb.as<X>() + r * n;
          double dot = 0;
          for (std::int64_t i = 0; i < n; ++i) dot += static_cast<double>(ld(p[i])) * ld(dp[i]);
          for (std::int64_t i = 0; i < n; ++i) dx[i] = st<X>(ld(p[i]) * (ld(dp[i]) - static_cast<float>(dot)));
        }
      });
    });
  }

  // --- Attention ----------------------------------------------------------------------------------------------------
  //
  // Per (sequence, query head): S = q k^T / sqrt(d) over the whole [seq x seq] block, the causal softmax row by
  // row (P above the diagonal is 0), out = P v. A head's q/k/v slices are read in place when fp32 (ld = the
  // row width), else widened to contiguous fp32 scratch.

  struct HeadView {
    const float* q;
    const float* k;
    const float* v;
    std::int64_t ldq, ldkv;
  };

  HeadView head_view(const AttentionShape& s, const Buffer& q, const Buffer& k, const Buffer& v, std::int64_t b,
                     std::int64_t hd) {
    const std::int64_t wq = s.heads * s.head_dim, wkv = s.kv_heads * s.head_dim;
    const std::int64_t kvh = hd / (s.heads / s.kv_heads);
    const std::int64_t q0 = b * s.seq * wq + hd * s.head_dim, kv0 = b * s.seq * wkv + kvh * s.head_dim;
    if (q.type == ScalarType::kFp32)
      return {q.as<const float>() + q0, k.as<const float>() + kv0, v.as<const float>() + kv0, wq, wkv};
    gather_head(q, q0, wq, s.seq, s.head_dim, hq_);
    gather_head(k, kv0, wkv, s.seq, s.head_dim, hk_);
    gather_head(v, kv0, wkv, s.seq, s.head_dim, hv_);
    return {hq_.data(), hk_.data(), hv_.data(), s.head_dim, s.head_dim};
  }

  // [seq x d] rows `stride` apart starting at `offset`, widened to contiguous fp32.
  static void gather_head(const Buffer& x, std::int64_t offset, std::int64_t stride, std::int64_t seq, std::int64_t d,
                          std::vector<float>& out) {
    out.resize(static_cast<std::size_t>(seq * d));
    on_type(x.type, [&](auto tag) {
      using T = decltype(tag);
      const T* p = x.as<const T>() + offset;
      for (std::int64_t t = 0; t < seq; ++t)
        for (std::int64_t i = 0; i < d; ++i) out[t * d + i] = ld(p[t * stride + i]);
    });
  }

  // y[seq x d] (rows `stride` apart, at `offset`) = (or +=) the contiguous fp32 scratch, rounded to y's type.
  static void scatter_head(const std::vector<float>& in, const Buffer& y, std::int64_t offset, std::int64_t stride,
                           std::int64_t seq, std::int64_t d, bool accumulate) {
    on_type(y.type, [&](auto tag) {
      using T = decltype(tag);
      T* p = y.as<T>() + offset;
      for (std::int64_t t = 0; t < seq; ++t)
        for (std::int64_t i = 0; i < d; ++i)
          p[t * stride + i] = st<T>(accumulate ? ld(p[t * stride + i]) + in[t * d + i] : in[t * d + i]);
    });
  }

  void do_attention_forward(const AttentionShape& s, const Buffer& q, const Buffer& k, const Buffer& v,
                            const Buffer& out, const Buffer& lse, const Buffer& reserve) override {
    if (s.algorithm == AttentionAlgorithm::kPasa) return pasa_forward(s, q, k, v, out, lse);
    const std::int64_t seq = s.seq, d = s.head_dim, wq = s.heads * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const bool f32 = q.type == ScalarType::kFp32;
    if (reserve.empty()) probs_.resize(static_cast<std::size_t>(seq * seq));
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t hd = 0; hd < s.heads; ++hd) {
        const HeadView h = head_view(s, q, k, v, b, hd);
        const std::int64_t q0 = b * seq * wq + hd * d;
        float* p = reserve.empty() ? probs_.data() : reserve.as<float>() + (b * s.heads + hd) * seq * seq;
        float* row_lse = lse.as<float>() + (b * s.heads + hd) * seq;
        // Step 1: scores = q k^T / sqrt(d) for the whole [seq x seq] block (the mask comes next).
        sgemm(false, true, seq, seq, d, scale, h.q, h.ldq, h.k, h.ldkv, 0.0f, p, seq);
        // Step 2: causal softmax per query row i over keys j <= i; the masked part becomes 0.
        for (std::int64_t i = 0; i < seq; ++i) {
          float* row = p + i * seq;
          float mx = row[0];
          for (std::int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
          float sum = 0;
          for (std::int64_t j = 0; j <= i; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          const float inv = 1.0f / sum;
          for (std::int64_t j = 0; j <= i; ++j) row[j] *= inv;
          for (std::int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
          row_lse[i] = mx + std::log(sum);
        }
        // Step 3: out = P v.
        if (f32) {
          sgemm(false, false, seq, d, seq, 1.0f, p, seq, h.v, h.ldkv, 0.0f, out.as<float>() + q0, wq);
        } else {
          ho_.resize(static_cast<std::size_t>(seq * d));
          sgemm(false, false, seq, d, seq, 1.0f, p, seq, h.v, h.ldkv, 0.0f, ho_.data(), d);
          scatter_head(ho_, out, q0, wq, seq, d, /*accumulate=*/false);
        }
      }
    }
  }

  // With S = q k^T * scale and P = softmax(S): dP = dO v^T, dv = P^T dO, dS = P * (dP - rowsum(P * dP)),
  // dq = scale * dS k, dk = scale * dS^T q. Query heads sharing a kv head add their dk, dv. Without a reserve,
  // P is recomputed as exp(S - lse) (flash attention's backward).
  void do_attention_backward(const AttentionShape& s, const Buffer& q, const Buffer& k, const Buffer& v,
                             const Buffer& /*out*/, const Buffer& dout, const Buffer& lse, const Buffer& reserve,
                             const Buffer& dq, const Buffer& dk, const Buffer& dv) override {
    const std::int64_t seq = s.seq, d = s.head_dim, wq = s.heads * d, wkv = s.kv_heads * d;
    const std::int64_t group = s.heads / s.kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const bool f32 = q.type == ScalarType::kFp32;
    scratch_.resize(static_cast<std::size_t>(seq * seq));
    if (reserve.empty()) probs_.resize(static_cast<std::size_t>(seq * seq));
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t hd = 0; hd < s.heads; ++hd) {
        const HeadView h = head_view(s, q, k, v, b, hd);
        const bool first_of_group = hd % group == 0, last_of_group = hd % group == group - 1;
        const std::int64_t q0 = b * seq * wq + hd * d, kv0 = b * seq * wkv + (hd / group) * d;
        const float* p = reserve.empty()
                             ? recompute_probs(h, lse.as<const float>() + (b * s.heads + hd) * seq, seq, d, scale)
                             : reserve.as<const float>() + (b * s.heads + hd) * seq * seq;
        const float* go = f32 ? dout.as<const float>() + q0 : nullptr;
        std::int64_t ldo = wq;
        if (!f32) {
          gather_head(dout, q0, wq, seq, d, hdo_);
          go = hdo_.data();
          ldo = d;
        }
        float* ds = scratch_.data();
        sgemm(false, true, seq, seq, d, 1.0f, go, ldo, h.v, h.ldkv, 0.0f, ds, seq);  // dP
        // dv (summed over the group's query heads: the first writes, the others add).
        if (f32) {
          sgemm(true, false, seq, d, seq, 1.0f, p, seq, go, ldo, first_of_group ? 0.0f : 1.0f, dv.as<float>() + kv0,
                wkv);
        } else {
          if (first_of_group) gdv_.assign(static_cast<std::size_t>(seq * d), 0.0f);
          sgemm(true, false, seq, d, seq, 1.0f, p, seq, go, ldo, 1.0f, gdv_.data(), d);
        }
        for (std::int64_t i = 0; i < seq; ++i) {
          const float* pr = p + i * seq;
          float* dr = ds + i * seq;
          float dot = 0;
          for (std::int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
          for (std::int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
          for (std::int64_t j = i + 1; j < seq; ++j) dr[j] = 0.0f;
        }
        if (f32) {
          sgemm(false, false, seq, d, seq, scale, ds, seq, h.k, h.ldkv, 0.0f, dq.as<float>() + q0, wq);  // dq
          sgemm(true, false, seq, d, seq, scale, ds, seq, h.q, h.ldq, first_of_group ? 0.0f : 1.0f,
                dk.as<float>() + kv0, wkv);  // dk
        } else {
          hdq_.resize(static_cast<std::size_t>(seq * d));
          sgemm(false, false, seq, d, seq, scale, ds, seq, h.k, h.ldkv, 0.0f, hdq_.data(), d);
          scatter_head(hdq_, dq, q0, wq, seq, d, /*accumulate=*/false);
          if (first_of_group) gdk_.assign(static_cast<std::size_t>(seq * d), 0.0f);
          sgemm(true, false, seq, d, seq, scale, ds, seq, h.q, h.ldq, 1.0f, gdk_.data(), d);
          if (last_of_group) {  // the group's sums, rounded once
            scatter_head(gdk_, dk, kv0, wkv, seq, d, /*accumulate=*/false);
            scatter_head(gdv_, dv, kv0, wkv, seq, d, /*accumulate=*/false);
          }
        }
      }
    }
  }

  // PASA, one head at a time through the reference algorithm (attention_reference.h), with every quantity
  // rounded to the buffers' type: in fp16, the arithmetic a GPU kernel of it performs.
  void pasa_forward(const AttentionShape& s, const Buffer& q, const Buffer& k, const Buffer& v, const Buffer& out,
                    const Buffer& lse) {
    const std::int64_t seq = s.seq, d = s.head_dim, wq = s.heads * d, wkv = s.kv_heads * d;
    const std::int64_t group = s.heads / s.kv_heads;
    ho_.resize(static_cast<std::size_t>(seq * d));
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t hd = 0; hd < s.heads; ++hd) {
        const std::int64_t q0 = b * seq * wq + hd * d, kv0 = b * seq * wkv + (hd / group) * d;
        gather_head(q, q0, wq, seq, d, hq_);
        gather_head(k, kv0, wkv, seq, d, hk_);
        gather_head(v, kv0, wkv, seq, d, hv_);
        const reference::Head head{hq_.data(), hk_.data(), hv_.data(), seq, d, d, d};
        reference::pasa_attention(head, q.type, reference::kPasaBlock, reference::pasa_default_beta(), ho_.data(), d,
                                  lse.as<float>() + (b * s.heads + hd) * seq);
        scatter_head(ho_, out, q0, wq, seq, d, /*accumulate=*/false);
      }
  }

  // P = exp(q k^T * scale - lse) below the diagonal, 0 above, into probs_.
  const float* recompute_probs(const HeadView& h, const float* row_lse, std::int64_t seq, std::int64_t d, float scale) {
    float* p = probs_.data();
    sgemm(false, true, seq, seq, d, scale, h.q, h.ldq, h.k, h.ldkv, 0.0f, p, seq);
    for (std::int64_t i = 0; i < seq; ++i) {
      float* row = p + i * seq;
      for (std::int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - row_lse[i]);
      for (std::int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
    }
    return p;
  }

  // --- Cross-entropy ----------------------------------------------------------------------------------------------

  void do_cross_entropy_forward(const Buffer& logits, const Buffer& targets, const Buffer& reserve,
                                const Buffer& loss_sum, std::int64_t rows, std::int64_t vocab) override {
    const std::int32_t* target = targets.as<const std::int32_t>();
    for (std::int64_t r = 0; r < rows; ++r)
      if (target[r] < 0 || target[r] >= vocab) return bad_id(target[r], vocab);
    double total = 0;
    on_type(logits.type, [&](auto tag) {
      using T = decltype(tag);
      for (std::int64_t r = 0; r < rows; ++r) {
        // -log softmax(l)[target] = logsumexp(l) - l[target].
        const float* l = widen(logits, r * vocab, vocab, row_);
        const double lse = softmax_row(l, reserve.as<float>() + r * vocab, vocab);
        total += lse - static_cast<double>(ld(logits.as<const T>()[r * vocab + target[r]]));
      }
    });
    loss_sum.as<double>()[0] += total;
  }

  void do_cross_entropy_backward(const Buffer& /*logits*/, const Buffer& targets, const Buffer& reserve, float scale,
                                 const Buffer& dlogits, std::int64_t rows, std::int64_t vocab) override {
    const std::int32_t* target = targets.as<const std::int32_t>();
    for (std::int64_t r = 0; r < rows; ++r)
      if (target[r] < 0 || target[r] >= vocab) return bad_id(target[r], vocab);
    on_type(dlogits.type, [&](auto tag) {
      using T = decltype(tag);
      const float* probs = reserve.as<const float>();
      T* dl = dlogits.as<T>();
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t i = 0; i < vocab; ++i) {
          float g = scale * probs[r * vocab + i];
          if (i == target[r]) g -= scale;
          dl[r * vocab + i] = st<T>(g);
        }
      }
    });
  }

  // --- MoE ----------------------------------------------------------------------------------------------------------

  void do_moe_topk(const Buffer& probs, const Buffer& selected, const Buffer& weight, const Buffer& psum,
                   const Buffer& expert_count, std::int64_t t, std::int64_t e, std::int64_t k) override {
    std::int64_t* count = expert_count.as<std::int64_t>();
    std::fill_n(count, e, 0);
    for (std::int64_t i = 0; i < t; ++i) {
      const float* p = probs.as<const float>() + i * e;
      std::int32_t* sel = selected.as<std::int32_t>() + i * k;
      top_k(p, e, k, sel);
      float sum = 0;
      for (std::int64_t s = 0; s < k; ++s) sum += p[sel[s]];
      psum.as<float>()[i] = sum;
      for (std::int64_t s = 0; s < k; ++s) {
        weight.as<float>()[i * k + s] = p[sel[s]] / sum;
        ++count[sel[s]];
      }
    }
  }

  void do_moe_aux_loss(const Buffer& probs, const Buffer& expert_count, const Buffer& fraction, const Buffer& aux_sum,
                       std::int64_t t, std::int64_t e, std::int64_t k) override {
    const float* p = probs.as<const float>();
    double aux = 0;
    for (std::int64_t j = 0; j < e; ++j) {
      const float f = static_cast<float>(static_cast<double>(expert_count.as<const std::int64_t>()[j]) /
                                         static_cast<double>(t * k));
      fraction.as<float>()[j] = f;
      double mean_p = 0;
      for (std::int64_t i = 0; i < t; ++i) mean_p += p[i * e + j];
      aux += static_cast<double>(f) * mean_p / static_cast<double>(t);
    }
    aux *= static_cast<double>(e);
    aux_sum.as<double>()[0] += aux;
  }

  // Rows in (expert, token, slot) order: each expert's first row is the prefix sum of the counts before it.
  void do_moe_permute(const Buffer& x, const Buffer& selected, const Buffer& expert_count, const Buffer& rows,
                      const Buffer& send_row, std::int64_t t, std::int64_t e, std::int64_t k, std::int64_t h) override {
    const std::int64_t* count = expert_count.as<const std::int64_t>();
    next_.resize(static_cast<std::size_t>(e));
    std::int64_t row = 0;
    for (std::int64_t j = 0; j < e; ++j) {
      next_[j] = row;
      row += count[j];
    }
    const std::size_t row_bytes = static_cast<std::size_t>(h * scalar_bytes(x.type));
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t s = 0; s < k; ++s) {
        const std::int32_t expert = selected.as<const std::int32_t>()[i * k + s];
        if (expert < 0 || expert >= e) return bad_id(expert, e);
        const std::int64_t r = next_[expert]++;
        send_row.as<std::int64_t>()[i * k + s] = r;
        std::memcpy(static_cast<char*>(rows.data) + r * row_bytes, static_cast<const char*>(x.data) + i * row_bytes,
                    row_bytes);
      }
    }
  }

  void do_moe_combine(const Buffer& rows, const Buffer& send_row, const Buffer& weight, const Buffer& xb,
                      std::int64_t t, std::int64_t k, std::int64_t h, bool accumulate) override {
    on_types(rows.type, xb.type, [&](auto tr, auto tx) {
      using R = decltype(tr);
      using X = decltype(tx);
      const std::int64_t* where = send_row.as<const std::int64_t>();
      for (std::int64_t i = 0; i < t; ++i) {
        X* xi = xb.as<X>() + i * h;
        if constexpr (std::is_same_v<X, float>) {
          if (!accumulate) std::fill_n(xi, h, 0.0f);
          for (std::int64_t s = 0; s < k; ++s) {
            const float w = weight.empty() ? 1.0f : weight.as<const float>()[i * k + s];
            const R* y = rows.as<const R>() + where[i * k + s] * h;
            for (std::int64_t c = 0; c < h; ++c) xi[c] += w * ld(y[c]);
          }
        } else {
          row_.resize(static_cast<std::size_t>(h));
          for (std::int64_t c = 0; c < h; ++c) row_[c] = accumulate ? ld(xi[c]) : 0.0f;
          for (std::int64_t s = 0; s < k; ++s) {
            const float w = weight.empty() ? 1.0f : weight.as<const float>()[i * k + s];
            const R* y = rows.as<const R>() + where[i * k + s] * h;
            for (std::int64_t c = 0; c < h; ++c) row_[c] += w * ld(y[c]);
          }
          for (std::int64_t c = 0; c < h; ++c) xi[c] = st<X>(row_[c]);
        }
      }
    });
  }

  void do_moe_combine_backward(const Buffer& dxb, const Buffer& rows, const Buffer& send_row, const Buffer& weight,
                               const Buffer& grad_rows, const Buffer& dweight, std::int64_t t, std::int64_t k,
                               std::int64_t h) override {
    on_types(dxb.type, rows.type, [&](auto tx, auto tr) {
      using X = decltype(tx);
      using R = decltype(tr);
      on_type(grad_rows.type, [&](auto tg) {
        using G = decltype(tg);
        for (std::int64_t i = 0; i < t; ++i) {
          const X* dxi = dxb.as<const X>() + i * h;
          for (std::int64_t s = 0; s < k; ++s) {
            const std::int64_t r = send_row.as<const std::int64_t>()[i * k + s];
            const float w = weight.as<const float>()[i * k + s];
            const R* y = rows.as<const R>() + r * h;
            G* g = grad_rows.as<G>() + r * h;
            double dot = 0;
            for (std::int64_t c = 0; c < h; ++c) {
              g[c] = st<G>(w * ld(dxi[c]));
              dot += static_cast<double>(ld(dxi[c])) * ld(y[c]);
            }
            dweight.as<float>()[i * k + s] = static_cast<float>(dot);
          }
        }
      });
    });
  }

  // Gates w_s = p_s / S (S = sum of the selected p) give dL/dp_s = (g_s - sum_r g_r w_r) / S; the aux loss adds
  // aux_coef * f_e for every token (f_e is a count, not differentiable).
  void do_moe_router_backward(const Buffer& dweight, const Buffer& weight, const Buffer& selected, const Buffer& psum,
                              const Buffer& fraction, float aux_coef, const Buffer& dpb, std::int64_t t, std::int64_t e,
                              std::int64_t k) override {
    const float* dw = dweight.as<const float>();
    const float* w = weight.as<const float>();
    const std::int32_t* sel = selected.as<const std::int32_t>();
    for (std::int64_t i = 0; i < t; ++i) {
      float* dp = dpb.as<float>() + i * e;
      for (std::int64_t j = 0; j < e; ++j) dp[j] = aux_coef * fraction.as<const float>()[j];
      float gw = 0;
      for (std::int64_t s = 0; s < k; ++s) gw += dw[i * k + s] * w[i * k + s];
      for (std::int64_t s = 0; s < k; ++s) dp[sel[i * k + s]] += (dw[i * k + s] - gw) / psum.as<const float>()[i];
    }
  }

  void do_moe_group(const Buffer& recv, const Buffer& counts, const Buffer& grouped, const Buffer& order,
                    const Buffer& offsets, std::int64_t sources, std::int64_t local, std::int64_t h) override {
    const std::int64_t* c = counts.as<const std::int64_t>();
    const std::int64_t capacity = recv.count / h;
    std::int64_t* off = offsets.as<std::int64_t>();
    // Each expert's first grouped row, and the first received row of each (source, expert) run.
    off[0] = 0;
    for (std::int64_t l = 0; l < local; ++l) {
      std::int64_t n = 0;
      for (std::int64_t j = 0; j < sources; ++j) n += c[j * local + l];
      off[l + 1] = off[l] + n;
    }
    for (std::int64_t i = 0; i < sources * local; ++i)
      if (c[i] < 0) return fail(Status::Internal("moe_group (cpu): negative row count " + std::to_string(c[i])));
    if (off[local] > capacity)
      return fail(Status::Internal("moe_group (cpu): " + std::to_string(off[local]) + " rows received, capacity " +
                                   std::to_string(capacity)));
    const std::size_t row_bytes = static_cast<std::size_t>(h * scalar_bytes(recv.type));
    std::int64_t* ord = order.as<std::int64_t>();
    std::int64_t received = 0;  // first received row of run (j, l), walking sources then experts
    next_.assign(off, off + local);
    for (std::int64_t j = 0; j < sources; ++j) {
      for (std::int64_t l = 0; l < local; ++l) {
        for (std::int64_t r = 0; r < c[j * local + l]; ++r, ++received) {
          const std::int64_t pos = next_[l]++;
          ord[pos] = received;
          std::memcpy(static_cast<char*>(grouped.data) + pos * row_bytes,
                      static_cast<const char*>(recv.data) + received * row_bytes, row_bytes);
        }
      }
    }
  }

  void do_moe_ungroup(const Buffer& grouped, const Buffer& order, const Buffer& offsets, const Buffer& out,
                      std::int64_t local, std::int64_t width) override {
    const std::int64_t live = offsets.as<const std::int64_t>()[local];
    const std::size_t row_bytes = static_cast<std::size_t>(width * scalar_bytes(grouped.type));
    const std::int64_t* ord = order.as<const std::int64_t>();
    for (std::int64_t p = 0; p < live; ++p)
      std::memcpy(static_cast<char*>(out.data) + ord[p] * row_bytes,
                  static_cast<const char*>(grouped.data) + p * row_bytes, row_bytes);
  }

  void do_sum_counts(const Buffer& counts, const Buffer& out, std::int64_t n, std::int64_t local,
                     std::int64_t multiplier) override {
    for (std::int64_t j = 0; j < n; ++j) {
      std::int64_t sum = 0;
      for (std::int64_t l = 0; l < local; ++l) sum += counts.as<const std::int64_t>()[j * local + l];
      out.as<std::int64_t>()[j] = sum * multiplier;
    }
  }

  void do_expert_gemm(const ExpertGemmArgs& a) override {
    const std::int64_t* off = a.offsets.as<const std::int64_t>();
    const std::int64_t in_w = a.trans_w ? a.w_cols : a.w_rows, out_w = a.trans_w ? a.w_rows : a.w_cols;
    for (std::int64_t g = 0; g < a.groups; ++g) {
      const std::int64_t rows = off[g + 1] - off[g];
      if (rows <= 0) continue;
      gemm_any(false, a.trans_w, rows, out_w, in_w, 1.0f, a.a, off[g] * in_w, in_w, rows, in_w, a.w, g * a.w_stride,
               a.w_cols, a.w_rows, a.w_cols, a.accumulate ? 1.0f : 0.0f, a.c, off[g] * out_w, out_w);
    }
  }

  void do_expert_gemm_dw(const ExpertGemmArgs& a) override {
    const std::int64_t* off = a.offsets.as<const std::int64_t>();
    for (std::int64_t g = 0; g < a.groups; ++g) {
      const std::int64_t rows = off[g + 1] - off[g];
      if (rows <= 0) continue;
      gemm_any(true, false, a.w_rows, a.w_cols, rows, 1.0f, a.a, off[g] * a.w_rows, a.w_rows, rows, a.w_rows, a.c,
               off[g] * a.w_cols, a.w_cols, rows, a.w_cols, 1.0f, a.w, g * a.w_stride, a.w_cols);
    }
  }

 private:
  // C (+)= op(A) op(B) on any tensor types: fp32 operands go to sgemm in place; 16-bit ones are widened
  // (A: a_rows x a_cols as stored, B likewise), multiplied in fp32, and C is rounded once.
  void gemm_any(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const Buffer& a,
                std::int64_t a_off, std::int64_t lda, std::int64_t a_rows, std::int64_t a_cols, const Buffer& b,
                std::int64_t b_off, std::int64_t ldb, std::int64_t b_rows, std::int64_t b_cols, float beta,
                const Buffer& c, std::int64_t c_off, std::int64_t ldc) {
    const float* pa = widen(a, a_off, span(a_rows, a_cols, lda), wa_);
    const float* pb = widen(b, b_off, span(b_rows, b_cols, ldb), wb_);
    if (c.type == ScalarType::kFp32) {
      sgemm(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, c.as<float>() + c_off, ldc);
      return;
    }
    wc_.assign(static_cast<std::size_t>(m * n), 0.0f);
    on_type(c.type, [&](auto tag) {
      using T = decltype(tag);
      T* pc = c.as<T>() + c_off;
      if (beta != 0.0f)
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) wc_[i * n + j] = ld(pc[i * ldc + j]);
      sgemm(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, wc_.data(), n);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) pc[i * ldc + j] = st<T>(wc_[i * n + j]);
    });
  }

  void bad_id(std::int64_t id, std::int64_t limit) {
    fail(Status::Internal("cpu kernels: index " + std::to_string(id) + " outside [0, " + std::to_string(limit) + ")"));
  }

  // Scratch, reused across calls (one Kernels serves one stream, so one thread).
  std::vector<float> wa_, wb_, wc_, row_, probs_, scratch_;
  std::vector<float> hq_, hk_, hv_, ho_, hdo_, hdq_, gdk_, gdv_;
  std::vector<std::int64_t> next_, order_;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels(Stream& stream) {
  return std::make_unique<CpuKernels>(stream);
}

}  // namespace hzp::runtime
