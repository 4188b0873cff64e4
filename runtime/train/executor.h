// The runtime executor: runs the core's schedule IR (shared/ir/schedule.h) for one rank on a device
// (runtime/device/: any backend) and trains the model (runtime/model) with it, in the scenario's precision
// (fp32; bf16 or fp16 with fp32 master weights and Adam moments; gradients in the working type or fp32).
//
// The host thread walks the rank's program in order and submits every op on its stream, after making the
// stream wait for the events of the op's dependencies on other streams (CUDA-style). It reads only the IR's
// typed fields; what each op does:
//   compute              the module's forward/backward for the micro-batch (ComputeOp: module, unit, phase),
//                        reading parameters from the unit's gather slot (sharded parameters) or the resident
//                        copy, accumulating gradients into the bucket's gradient slot (sharded gradients) or
//                        the resident gradients;
//   gather_params        shards -> the gather slot (gather_secondary: from hpZ's node copy);
//   refresh_params       optimizer slices -> the parameter shard (last step's update);
//   reduce_grads         gradient slot -> resident gradient shard;
//   reduce_to_optimizer  gradient shard -> optimizer slice, in place;
//   sync_replicas        the optimizer slice's gradients across replicas;
//   grad_norm            the partial squared norms over the world (clipping);
//   moe_*                MoE tokens to the ranks holding their experts and back, and their gradients;
//   acquire / release    pool slot bookkeeping by PoolKind (gradient slots are zeroed when acquired);
//   optimizer_step       AdamW on this rank's optimizer slice of the bucket, then its gradients are zeroed.
// Every op's work is kernel and collective calls on its stream (runtime/device/kernels.h): no host loop
// touches device memory, and the host reads the step's loss, aux loss and gradient norm once, after the step.
// Buffer layout: state_layout.h. The model code never sees sharding.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/model/model.h"
#include "runtime/train/data.h"
#include "shared/base/status.h"
#include "shared/ir/schedule.h"
#include "shared/scenario/scenario.h"

namespace hzp::runtime {

struct StepMetrics {
  double loss = 0;  // mean token cross-entropy over the global batch (nats)
  double aux_loss =
      0;  // MoE load-balancing loss (without its coefficient), mean over micro-batches, summed over layers
  double grad_norm = 0;  // global L2 norm before clipping (0 when no norm is taken: fp32/bf16 without clipping)
  double lr = 0;
  double seconds = 0;
  double loss_scale = 1;  // fp16: the dynamic loss scale the step used (1 otherwise)
  bool skipped = false;   // fp16: the gradients overflowed, the update was skipped and the scale halved
  bool stop = false;      // some rank asked to stop after this step (train_step's stop_requested)
};

// One executed op, for --trace.
struct ExecutedOp {
  std::int64_t step = 0;
  int op = 0;
  int stream = 0;
  double start_us = 0;  // steady clock, microseconds since its epoch (shared by processes on a host)
  double end_us = 0;
  std::int64_t bytes = 0;  // bytes the op moved (collectives), in the types as executed
};

// Bytes per memory category on this rank: "params", "grads", "optimizer", "pool:<name>", plus "eval".
using MemoryReport = std::map<std::string, std::int64_t>;

class Executor {
 public:
  // Builds the rank's buffers, streams and communicators on `device` (one communicator per (group, stream)
  // the program uses, plus one over every rank for metrics, outside the IR). `on_fatal` is called once,
  // from the failing stream's thread, with the first error of any op (the caller decides what to do: `hzp
  // train` ends the process, so that no other stream waits on a collective until its timeout).
  static Result<std::unique_ptr<Executor>> create(const Scenario& scenario, const Schedule& schedule, int rank,
                                                  const ByteDataset* data, Device& device,
                                                  std::function<void(const Status&)> on_fatal);
  ~Executor();

  // Runs training step `step` (0-based): every micro-batch, gradient sync and the optimizer. Returns the
  // global metrics (all ranks agree on them).
  // `stop_requested`: this rank was asked to stop (an interrupt); it travels with the step's metrics, so that
  // every rank learns in the same step that one was (StepMetrics::stop) and they stop together.
  Result<StepMetrics> train_step(std::int64_t step, bool stop_requested = false);
  // Mean validation cross-entropy over `groups` validation micro-batch groups (dealt round-robin to ranks).
  Result<double> evaluate(std::int64_t groups);

  // Sharded checkpoint of this rank (parameters, Adam moments, the next step), written to `path`
  // atomically (temp file + rename). load() refuses a file of another layout.
  Status save(const std::string& path, std::int64_t next_step) const;
  Result<std::int64_t> load(const std::string& path);

  MemoryReport memory() const;
  // Fault injection (fp16): step `step` runs with a loss scale of 2^40, so that its gradients overflow and the
  // loss scaler's skip-and-halve path runs (the scale after it is half the one before, as for any overflow).
  void inject_overflow(std::int64_t step);
  // Recording of executed ops (off by default: a long run would keep every event).
  void set_tracing(bool on);
  const std::vector<ExecutedOp>& trace() const { return trace_; }
  int rank() const;

  struct Impl;

 private:
  explicit Executor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::vector<ExecutedOp> trace_;
};

// kInvalidInput naming the field when the runtime cannot train this scenario (FP8, recompute, model family,
// vocabulary, ...): checked once before any rank starts.
Status runtime_supports(const Scenario& scenario);

// Learning rate of `step` (0-based): linear warm-up to lr over warmup_steps, then cosine to min_lr at `steps`.
double learning_rate(const RunSpec& run, std::int64_t step);

}  // namespace hzp::runtime
