// AdamW (Loshchilov & Hutter 2019) on one contiguous slice of a module's flat parameters, in fp64
// arithmetic on fp32 storage: m <- b1 m + (1-b1) g, v <- b2 v + (1-b2) g^2, w <- w - lr wd w (matrices only)
// - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), with g scaled by the clipping coefficient.
#pragma once

#include <cstdint>

#include "runtime/model/model.h"

namespace hzp::runtime {

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  std::int64_t t = 1;  // optimizer steps taken, this one included (bias correction)
  float clip = 1;      // gradient scale from global-norm clipping
};

// Updates elements [begin, begin + count) of a module laid out as `layout` (offsets in the layout's
// coordinates): p, g, m, v point at element `begin`.
void adamw_update(const AdamWStep& step, const Layout& layout, std::int64_t begin, std::int64_t count, float* p,
                  const float* g, float* m, float* v);

}  // namespace hzp::runtime
