// The roofline duration source (see duration_model.h).
#include "shared/cost/duration_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "shared/base/hash.h"
#include "shared/cost/collective_cost.h"

namespace hzp {

double RooflineDurations::compute_s(int /*rank*/, const ComputeOp& op) const {
  return compute_time(cluster_, op);
}

double RooflineDurations::optimizer_s(int /*rank*/, const OptimizerStepOp& op) const {
  return compute_time(cluster_, 0, op.mem_bytes);
}

double SpreadDurations::speed_factor(int rank) const {
  return std::max(0.5, 1 + spread_ * fixed_normal(static_cast<std::uint64_t>(rank)));
}

namespace {
double unit_open(std::uint64_t bits) {  // (0, 1)
  return (static_cast<double>(bits >> 11) + 0.5) / 9007199254740992.0;
}
}  // namespace

double fixed_normal(std::uint64_t index) {
  const double u1 = unit_open(splitmix64(2 * index + 1));
  const double u2 = unit_open(splitmix64(2 * index + 2));
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

}  // namespace hzp
