// The executor's state (executor.h), shared by its two source files: executor.cc (setup, the step loop,
// evaluation, checkpoints) and executor_ops.cc (what each IR op does). Private to runtime/train/.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device/communicator.h"
#include "runtime/device/kernels.h"
#include "runtime/model/model.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/executor.h"
#include "runtime/train/state_layout.h"

namespace hzp::runtime {

struct Executor::Impl {
  Scenario scenario;
  Schedule schedule;
  const Program* program = nullptr;
  int rank = 0;
  int world = 1;
  const ByteDataset* data = nullptr;
  Device* device = nullptr;
  ModelConfig cfg;  // with the working (act) and gradient types
  std::int64_t batch = 0, seq = 0, tokens = 0;
  std::int64_t groups_per_step = 0;  // micro-batch groups in the global batch
  StateLayout layout;

  // Resident buffers of each segment (StateLayout sizes them).
  struct SegmentBuffers {
    Buffer param;      // full (s_p = 1) or this rank's shard, in the working type
    Buffer grad;       // full (s_g = 1) or this rank's shard, in the gradient type
    Buffer master;     // fp32 master of the optimizer slice (16-bit training only)
    Buffer m, v;       // Adam moments of the optimizer slice
    Buffer secondary;  // hpZ: this rank's piece of the node-sharded copy
  };
  std::vector<SegmentBuffers> bufs;
  // The optimizer's tensors of each bucket: the parts of its segments' slices with one weight-decay rule.
  std::vector<std::vector<AdamWTensor>> adam_tensors;
  std::unique_ptr<MemoryPool> pool;
  std::vector<std::vector<Buffer>> pool_slots;  // [pool][slot]
  Buffer eval_params;                           // full parameters for evaluation (sharded runs)

  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Kernels>> kernels;  // one per stream
  std::unique_ptr<Stream> host_stream;            // metrics and evaluation collectives (outside the IR)
  std::unique_ptr<Kernels> host_kernels;
  std::map<std::pair<int, int>, std::unique_ptr<Communicator>> comms;  // (group, stream)
  std::unique_ptr<Communicator> metrics;
  std::function<void(const Status&)> on_fatal;
  std::atomic<bool> failed{false};

  // Model blocks (one per layer; their saved activations serve every micro-batch in turn).
  std::unique_ptr<Embedding> embedding;
  std::vector<std::unique_ptr<AttentionBlock>> attention;
  std::vector<std::unique_ptr<MlpBlock>> mlp;
  std::vector<std::unique_ptr<MoeBlock>> moe;
  std::unique_ptr<Head> head;
  Workspace workspace;
  Buffer x, dx;              // the residual stream and its gradient [tokens x hidden]
  Batch inputs;              // ids, targets (device), loss and aux sums (fp64 accumulators)
  Buffer metrics_buffer;     // fp32 [3]: loss and aux sums, all-reduced for logging, and stop requests
  Buffer norm_acc, norm_sq;  // the gradient norm: this rank's partial sum (fp64), all-reduced (fp32)
  Buffer grad_norm, coef;    // fp64 [1] global norm, fp32 [1] the optimizer's gradient multiplier
  std::vector<std::vector<std::int32_t>> host_ids, host_targets;  // per micro-batch (alive until copied)

  // Per step.
  std::int64_t step = 0;
  double lr = 0;
  std::int64_t adam_t = 0;  // optimizer steps taken (bias correction)
  // Dynamic loss scaling (fp16 only; 1 otherwise): PyTorch GradScaler's rule, see executor.cc.
  double loss_scale = 1;
  std::int64_t good_steps = 0;
  std::int64_t overflow_step = -1;  // fault injection: Executor::inject_overflow

  std::vector<ExecutedOp> traced;  // the last step's ops, timed by their streams' events (tracing only)
  bool tracing = false;

  Status setup();
  Status setup_streams();
  // Every allocation of the run, made against `p`: once against a SizingPool to learn the capacity, then
  // against the device's pool.
  Status allocate_all(MemoryPool& p);
  Status init_parameters_on_device();
  Status setup_comms();
  void build_optimizer_tensors();

  Communicator* comm(int role, int stream) {
    auto it = comms.find({schedule.rank_groups[rank][role], stream});
    return it == comms.end() ? nullptr : it->second.get();
  }
  // Any communicator of the group bound to `role`, with the index of the stream it belongs to (for
  // host-driven work).
  std::pair<Communicator*, int> any_comm(int role) {
    for (const auto& [key, c] : comms)
      if (key.first == schedule.rank_groups[rank][role]) return {c.get(), key.second};
    return {nullptr, -1};
  }
  int compute_stream() const;

  // Where segment s's parameters are read from / its gradients written to right now (empty: not available).
  Buffer param_of(int s, const Buffer& gather_slot) const;
  Buffer grad_of(int s, const std::vector<Buffer>& bucket_slot) const;
  int router_seg(int unit) const { return layout.find(unit, 1, StateKind::kDense, false); }
  int experts_seg(int unit) const {
    return layout.find(unit, 1, schedule.state(StateKind::kExpert).present ? StateKind::kExpert : StateKind::kDense,
                       true);
  }
  bool expert_parallel() const { return schedule.role_expert_parallel >= 0; }
  bool fp16() const { return cfg.act == ScalarType::kFp16; }
  // dL/d(aux loss of one micro-batch): the coefficient, averaged over the step's micro-batch groups, times the
  // loss scale.
  float aux_grad_scale() const {
    return static_cast<float>(cfg.aux_loss_coef / static_cast<double>(groups_per_step) * loss_scale);
  }
  // The executed dtype of a collective's payload (parameters and activations in the working type, gradients
  // in the gradient type, the norm in fp32).
  ScalarType payload_type(Payload p) const;

  // The module forwards, shared by training's compute ops and evaluation.
  Status forward_module(Kernels& k, ModuleKind module, int unit, const std::function<Buffer(int)>& P);
  // The stages of a MoE layer under expert parallelism around its all-to-alls (one per CollectivePurpose).
  Status moe_exchange(Kernels& k, CollectivePurpose purpose, int unit, Communicator& cm, const Buffer& router,
                      const Buffer& drouter);

  Status run_step(std::int64_t step_index);
  Status refresh_parameters();
  Status compute(Kernels& k, const ComputeOp& c, const Buffer& gather_slot, const std::vector<Buffer>& bucket_slot);
  Status collective(Kernels& k, const CollectiveOp& c, int stream, const Buffer& gather_slot,
                    const std::vector<Buffer>& bucket_slot);
  Status optimizer(Kernels& k, const OptimizerStepOp& o);
  void load_batch(Kernels& k, int micro_batch);
  // The checkpointed state (checkpoint.h), as host copies: per segment its parameter shard (as fp32), the
  // fp32 master (16-bit training), Adam m and Adam v.
  std::vector<std::vector<float>> state_to_host();
  Status state_from_host(const std::vector<std::vector<float>>& state);
  CheckpointHeader checkpoint_header(std::int64_t next_step) const;
};

}  // namespace hzp::runtime
