// PyTorch profiler (Kineto) traces in: the Chrome-trace JSON that `torch.profiler.profile(...)
// .export_chrome_trace()` writes (plain or gzipped), read into per-step GPU compute time by phase and the
// collectives with their sizes, then turned into an hzp trace (trace_format.h) of a scenario's schedule so
// that `hzp replay` and its what-ifs run on it.
//
// What is read (traces/README.md, "PyTorch profiler traces"):
//   - Steps and phases from the CPU `user_annotation` ranges: `ProfilerStep#N` ranges are the steps when
//     present, else each forward range starts one. Forward: `forward` or `*.forward` (DistributedDataParallel
//     .forward, FullyShardedDataParallel.forward); backward: `backward`; optimizer: `optimizer`,
//     `Optimizer.step*`, `Optimizer.zero_grad*`. GPU work launched between the end of a step's forward and
//     the start of its optimizer is backward (autograd launches it from its own thread).
//   - GPU work (`kernel`, `gpu_memset`, `gpu_memcpy`) takes the phase of the CPU call that launched it
//     (matched by `args.correlation`; its own start if the launch is missing). Compute is every kernel but
//     NCCL's, memsets and device-to-device copies; host copies are the gloo backend's or the data's.
//   - Collectives: NCCL kernels (`nccl*AllReduce*`, `*AllGather*`, `*ReduceScatter*`, `*Broadcast*`,
//     `*SendRecv*`) with the size of the `record_param_comms` call that launched them; gloo's CPU
//     `gloo:<op>` ranges with the size of the host-to-device copies of the matching GPU range.
//   - Several files (one per rank, `distributedInfo.rank` orders them when present) merged; files from
//     different hosts are aligned on the end of their first collective.
// The traces name no modules, so a phase's GPU time is spread over the schedule's ops of that phase in
// proportion to their roofline times (a documented fallback: per-layer detail comes from the model, the
// totals from the trace).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/cost/duration_model.h"
#include "shared/ir/schedule.h"
#include "shared/scenario/scenario.h"
#include "shared/trace/trace_format.h"

namespace hzp {

inline constexpr std::int64_t kMaxKinetoBytes = 256ll
                                                << 20;  // inflated JSON (a recorded profile decodes into about 6x that)
inline constexpr std::int64_t kMaxKinetoEvents = 2'000'000;  // the 531 M-parameter MoE profile has 153 k

enum class KinetoPhase { kForward, kBackward, kOptimizer };
inline constexpr int kKinetoPhases = 3;
const char* to_string(KinetoPhase phase);

struct KinetoCollective {
  TraceKind kind = TraceKind::kAllReduce;
  std::int64_t bytes = -1;  // nccl-tests convention (all-gather: output); -1 when the trace does not say
  double start_us = 0;
  double end_us = 0;
  std::string backend;  // "nccl" or "gloo"
};

struct KinetoStep {
  std::array<double, kKinetoPhases> busy_us{};   // GPU compute time (kernels, memsets, device copies)
  std::array<double, kKinetoPhases> first_us{};  // first start / last end of that work (0 when none)
  std::array<double, kKinetoPhases> last_us{};
  double kernel_us = 0;                       // kernels alone, NCCL's excluded: the profiler's "GPU kernel time"
  long long gemm_kernels = 0;                 // matrix multiplies (cuBLAS / cuBLASLt / CUTLASS / nvjet kernels)
  long long routing_kernels = 0;              // gathers, scatters and index kernels: a MoE's token routing
  std::vector<KinetoCollective> collectives;  // by start
};

struct KinetoProfile {
  std::string source;  // the file, for messages
  int rank = -1;       // distributedInfo.rank, when recorded
  int world_size = -1;
  std::string device;  // deviceProperties[0].name
  std::vector<KinetoStep> steps;
  long long gpu_events = 0;
  long long unattributed = 0;  // GPU work launched outside every step's phases (ignored)
  double unattributed_us = 0;
  long long collectives_unknown = 0;  // gloo ranges of other kinds (barrier, send, ...): ignored
  // NCCL kernels whose record_param_comms call gives no usable size (a message count that is not a whole
  // number >= 0, a dtype of unknown width): sized by the schedule instead, and said so; the first one's values.
  long long collectives_unsized = 0;
  std::string unsized_example;
};

// Whether the profiles can be a run of `scenario`, from what they show: the device they ran on against
// cluster.gpu.type (when both name a known GPU), and token routing (gather / scatter / index kernels, several
// per layer and step in a MoE, about none in a dense model) against whether the model has MoE layers.
// kInvalidInput saying what disagrees; `hzp import --no-check` skips it.
Status check_kineto_against(const std::vector<KinetoProfile>& profiles, const Scenario& scenario);

// Reads one profiler document. Errors name the source, the event index and the field.
Result<KinetoProfile> read_kineto(const nlohmann::json& doc, const std::string& source);
// The file (JSON or gzipped JSON, at most kMaxKinetoBytes inflated) read by read_kineto. A text with more
// than three JSON objects per allowed event, or whose decoded tree would pass twelve times kMaxKinetoBytes
// (many tiny values: "[0,0,...]"), is refused before it is parsed (json_io.h).
Result<KinetoProfile> load_kineto_file(const std::string& path);

struct KinetoImport {
  Trace trace;
  std::vector<std::string> notes;  // what did not map one to one, and what was done instead
  int steps = 0;
};

// The profiles (one per rank of `schedule`) as an hzp trace of `scenario`'s schedule: each phase's GPU
// compute time (plus its idle gaps when `include_idle`) spread over the phase's compute ops (the optimizer's
// over the optimizer steps) in proportion to `weights`, laid out from the phase's first GPU start; each of
// the schedule's collectives takes the recorded instance of its kind in order when the counts agree, else
// the recorded total of its kind spread by bytes (a note says so); kinds the trace did not record are left
// out (a replay simulates them).
Result<KinetoImport> kineto_to_trace(std::vector<KinetoProfile> profiles, const Scenario& scenario,
                                     const Schedule& schedule, const DurationModel& weights, bool include_idle);

}  // namespace hzp
