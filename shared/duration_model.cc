// The roofline duration source (see duration_model.h).
#include "shared/duration_model.h"

#include "shared/collective_cost.h"

namespace hzp {

double RooflineDurations::compute_s(int /*rank*/, const ComputeOp& op) const {
  return compute_time(cluster_, op.flops, op.mem_bytes);
}

double RooflineDurations::optimizer_s(int /*rank*/, const OptimizerStepOp& op) const {
  return compute_time(cluster_, 0, op.mem_bytes);
}

}  // namespace hzp
