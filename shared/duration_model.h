// Where the time of a compute or optimizer op comes from. The estimator and the simulator both ask a
// DurationModel, so a different source (a recorded trace, a one-node calibration) plugs in once for both.
// Collectives are not here: the estimator prices them with collective_cost.h, the simulator runs their flows.
//
// The smallest custom source (every forward twice as slow as the roofline says):
//   struct SlowForward : RooflineDurations {
//     using RooflineDurations::RooflineDurations;
//     double compute_s(int rank, const ComputeOp& op) const override {
//       const double t = RooflineDurations::compute_s(rank, op);
//       return op.phase == Phase::kForward ? 2 * t : t;
//     }
//   };
#pragma once

#include "shared/scenario.h"
#include "shared/schedule.h"

namespace hzp {

class DurationModel {
 public:
  virtual ~DurationModel() = default;
  // Seconds the op takes on `rank` with the GPU to itself.
  virtual double compute_s(int rank, const ComputeOp& op) const = 0;
  virtual double optimizer_s(int rank, const OptimizerStepOp& op) const = 0;
  // Human-readable name of the source, reported in summaries ("roofline", "trace FILE", ...).
  virtual const char* name() const = 0;
};

// The roofline of the scenario's GPU: max(flops / (peak · matmul efficiency), bytes / (HBM · efficiency)).
class RooflineDurations : public DurationModel {
 public:
  explicit RooflineDurations(const ClusterSpec& cluster) : cluster_(cluster) {}
  double compute_s(int rank, const ComputeOp& op) const override;
  double optimizer_s(int rank, const OptimizerStepOp& op) const override;
  const char* name() const override { return "roofline"; }

 private:
  ClusterSpec cluster_;
};

}  // namespace hzp
