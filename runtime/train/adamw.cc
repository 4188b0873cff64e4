// AdamW on a slice (adamw.h).
#include "runtime/train/adamw.h"

#include <algorithm>
#include <cmath>

namespace hzp::runtime {

void adamw_update(const AdamWStep& step, const Layout& layout, std::int64_t begin, std::int64_t count, float* p,
                  const float* g, float* m, float* v) {
  const double b1 = step.beta1, b2 = step.beta2;
  const double c1 = 1 - std::pow(b1, static_cast<double>(step.t));
  const double c2 = 1 - std::pow(b2, static_cast<double>(step.t));
  for (const TensorInfo& t : layout) {
    // The part of tensor t inside the slice; the padding past the layout is never touched.
    const std::int64_t lo = std::max(begin, t.offset), hi = std::min(begin + count, t.offset + t.size());
    const double decay = t.decay ? step.lr * step.weight_decay : 0.0;
    for (std::int64_t e = lo - begin; e < hi - begin; ++e) {
      const double grad = static_cast<double>(g[e] * step.clip);
      const double mm = b1 * m[e] + (1 - b1) * grad;
      const double vv = b2 * v[e] + (1 - b2) * grad * grad;
      m[e] = static_cast<float>(mm);
      v[e] = static_cast<float>(vv);
      double w = p[e];
      w -= decay * w;
      w -= step.lr * (mm / c1) / (std::sqrt(vv / c2) + step.eps);
      p[e] = static_cast<float>(w);
    }
  }
}

}  // namespace hzp::runtime
