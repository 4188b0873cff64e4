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

#include <cstdint>
#include <optional>

#include "shared/ir/schedule.h"
#include "shared/scenario/scenario.h"

namespace hzp {

class DurationModel {
 public:
  virtual ~DurationModel() = default;
  // Seconds the op takes on `rank` with the GPU to itself.
  virtual double compute_s(int rank, const ComputeOp& op) const = 0;
  virtual double optimizer_s(int rank, const OptimizerStepOp& op) const = 0;
  // Human-readable name of the source ("roofline", "variable GPUs", ...), for messages.
  virtual const char* name() const = 0;
};

// Where a collective's time comes from when it is not simulated as flows (a replayed trace): seconds from
// the last member's arrival to the end, for the `seq`-th collective of group `group` (the order each
// member meets the group's collectives in), or nothing to simulate it as usual.
class CollectiveDurations {
 public:
  virtual ~CollectiveDurations() = default;
  virtual std::optional<double> transfer_s(int group, long long seq) const = 0;
};

// The scenario's GPU, op by op: FLOPs at peak · GEMM efficiency plus memory-bound bytes at HBM · efficiency;
// FP8 FLOPs at the FP8 peak, the unfused attention core as max(FLOPs, operand bytes) (compute_time).
class RooflineDurations : public DurationModel {
 public:
  explicit RooflineDurations(const ClusterSpec& cluster) : cluster_(cluster) {}
  double compute_s(int rank, const ComputeOp& op) const override;
  double optimizer_s(int rank, const OptimizerStepOp& op) const override;
  const char* name() const override { return "roofline"; }

 private:
  ClusterSpec cluster_;
};

// A base source with per-GPU speed variability (ClusterSpec::compute_spread): rank r's compute and
// optimizer ops take speed_factor(r) times the base's.
class SpreadDurations : public DurationModel {
 public:
  SpreadDurations(const DurationModel& base, double spread) : base_(base), spread_(spread) {}
  double compute_s(int rank, const ComputeOp& op) const override {
    return speed_factor(rank) * base_.compute_s(rank, op);
  }
  double optimizer_s(int rank, const OptimizerStepOp& op) const override {
    return speed_factor(rank) * base_.optimizer_s(rank, op);
  }
  const char* name() const override { return "variable GPUs"; }
  // 1 + spread·z(rank), z a standard normal fixed per rank, at least 0.5.
  double speed_factor(int rank) const;

 private:
  const DurationModel& base_;
  double spread_;
};

// Standard normal draw determined by `index` alone (SplitMix64 + Box-Muller): the same on every machine.
double fixed_normal(std::uint64_t index);

}  // namespace hzp
