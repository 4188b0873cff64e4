// Replaying a recorded trace (traces/README.md, format v1) on its own configuration: the durations it
// recorded become the simulator's. Compute and optimizer ops take the time the same op (rank, unit,
// module, phase, micro-batch; optimizer: rank, bucket) took in the same step (the mean over the recorded
// steps beyond them); each collective instance takes its recorded transfer time — from the last member's
// arrival (the latest start among the members) to the latest end — so the replay reproduces what the
// recorded run's network and library did.
//
// The trace must match the schedule its scenario_config rebuilds: same ranks, streams and groups, and every
// event names an op of its rank's program of the event's kind. Anything else is an error naming the event.
#pragma once

#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "shared/base/status.h"
#include "shared/cost/collective_cost.h"
#include "shared/cost/duration_model.h"
#include "shared/ir/schedule.h"
#include "shared/trace/trace_format.h"

namespace hzp {

// The trace against the schedule its scenario_config rebuilds: world size, groups, and each event's op
// (in range, of the event's kind, on the event's group). The first mismatch, naming the event and field.
Status check_trace_against(const Trace& trace, const Schedule& schedule);

class TraceDurations : public DurationModel, public CollectiveDurations {
 public:
  // Checks the trace against the schedule; `fallback` times ops the trace never recorded.
  static Result<TraceDurations> make(const Trace& trace, const Schedule& schedule, const DurationModel& fallback);

  double compute_s(int rank, const ComputeOp& op) const override;
  double optimizer_s(int rank, const OptimizerStepOp& op) const override;
  std::optional<double> transfer_s(int group, long long seq) const override;
  const char* name() const override { return "recorded trace"; }

  int steps() const { return steps_; }
  // Ops the replay asked for that the trace did not record (timed by the fallback).
  long long fallbacks() const { return fallbacks_; }

 private:
  explicit TraceDurations(const DurationModel& fallback) : fallback_(&fallback) {}
  using ComputeKey = std::tuple<int, int, int, int, int>;  // rank, unit, module, phase, micro-batch
  // Recorded seconds per step; the simulator asks for an op once per step in step order, so the n-th call
  // of a key is step n (a replay longer than the trace takes the mean).
  std::map<ComputeKey, std::map<std::int64_t, double>> compute_steps_;
  std::map<std::pair<int, int>, std::map<std::int64_t, double>> optimizer_steps_;  // rank, bucket
  mutable std::map<ComputeKey, std::int64_t> compute_calls_;
  mutable std::map<std::pair<int, int>, std::int64_t> optimizer_calls_;
  std::map<std::pair<int, long long>, double> collective_;  // group, seq (step x per step + k)
  std::map<int, long long> per_step_;                       // group -> collectives per step
  const DurationModel* fallback_;
  int steps_ = 0;
  mutable long long fallbacks_ = 0;
};

// Per rank, the recorded time per step: (last event end - first event start) / steps, in seconds.
std::vector<double> recorded_step_times(const Trace& trace);
// Per rank, seconds per step during which at least one of its ops ran (the union of its events): the step
// time minus the rank's idle time (host work, launch gaps), which a replay, running ops back to back, lacks.
std::vector<double> recorded_busy_times(const Trace& trace);

// Per rank, its compute ops' model FLOPs at the GPU's peak (bf16, FP8 for FP8 FLOPs) over their recorded
// seconds: above 1, the trace's compute ran faster than the GPU can (edited times, or another clock); infinity
// where FLOPs were recorded in no time. 0 for a rank with no compute FLOPs.
std::vector<double> compute_speed_over_peak(const Trace& trace, const Schedule& schedule, const GpuSpec& gpu);

// What-ifs: a trace's compute speed carried to another configuration (cluster, scale, policy, micro-batch,
// sequence, layers). Each (module, phase) gets the rate it ran at in the trace — recorded seconds per FLOP
// summed over every rank, step, layer and micro-batch of the schedule the trace's own scenario builds
// (per byte for an op without FLOPs) — and an op of the new schedule takes its FLOPs (bytes) at that rate;
// an optimizer step takes the recorded seconds per parameter times its shard. So a larger micro-batch or
// sequence scales each op by its FLOPs, attention's quadratic part included. Ops of a (module, phase) the
// trace never ran fall back to `fallback` (counted). FLOPs an op runs in FP8 (ComputeOp::fp8_flops) count
// as `gpu`'s bf16 / FP8 peak ratio of a FLOP, in the trace and in the new schedule alike, so a what-if that
// turns training.fp8 on speeds up the linear layers by the peak ratio (and the reverse); the casts FP8 adds
// (memory-bound bytes) are not in a rate per FLOP, so such a what-if is an upper bound on FP8's gain
// (the one-H100 134 M trace: 61.2 -> 42.8 ms per step). Collectives are not here: the new cluster's network
// is simulated.
class TraceRates : public DurationModel {
 public:
  static Result<TraceRates> make(const Trace& trace, const Schedule& recorded, const DurationModel& fallback,
                                 const GpuSpec& gpu);
  double compute_s(int rank, const ComputeOp& op) const override;
  double optimizer_s(int rank, const OptimizerStepOp& op) const override;
  const char* name() const override { return "rates of a recorded trace"; }
  long long fallbacks() const { return fallbacks_; }

 private:
  TraceRates(const DurationModel& fallback, const GpuSpec& gpu)
      : gpu_(gpu), fp8_flop_(gpu.fp8_peak_flops > 0 ? gpu.peak_flops / gpu.fp8_gemm_peak() : 1), fallback_(&fallback) {}
  // The op's FLOPs with each FP8 one counted as fp8_flop_ of a bf16 one, and the flash kernel's as the GEMM
  // FLOPs that take as long (flash_at_gemm_rate).
  double weighted_flops(const ComputeOp& op) const {
    return op.flops - op.fp8_flops - op.flash_flops + op.fp8_flops * fp8_flop_ + flash_at_gemm_rate(gpu_, op);
  }
  struct Rate {
    double seconds = 0;
    double flops = 0;
    double bytes = 0;
  };
  std::map<std::pair<int, int>, Rate> rates_;  // module, phase
  GpuSpec gpu_;
  double optimizer_seconds_ = 0;
  double optimizer_params_ = 0;
  double fp8_flop_;
  const DurationModel* fallback_;
  mutable long long fallbacks_ = 0;
};

}  // namespace hzp
