// Where one GPU's step time goes, from its simulated op spans: compute by phase, communication by parallel
// dimension (transferring, and the part of it that no compute hides), and the time the GPU neither computes
// nor transfers (the pipeline bubble, waits for slower peers). The three parts partition the step:
//   step = compute busy + exposed communication + idle.
#pragma once

#include <array>

#include <nlohmann/json.hpp>

#include "shared/ir/schedule.h"
#include "sim/executor.h"

namespace hzp::sim {

// The parallel dimension a collective serves, from its group's role.
#define HZP_COMM_DIMENSIONS(X) \
  X(kData, "data")             \
  X(kTensor, "tensor")         \
  X(kPipeline, "pipeline")     \
  X(kExpert, "expert")         \
  X(kContext, "context")
#define HZP_ENUMERATOR(id, name) id,
enum class CommDimension { HZP_COMM_DIMENSIONS(HZP_ENUMERATOR) };
#undef HZP_ENUMERATOR
inline constexpr int kNumCommDimensions = 5;
const char* to_string(CommDimension d);
CommDimension comm_dimension(GroupRole role);

struct CommTime {
  double transfer_s = 0;  // collectives of this dimension moving data (from the last member's arrival)
  double exposed_s = 0;   // of which no compute of the GPU overlapped
};

// Per step (the spans' total over the steps run, divided by them).
struct StepBreakdown {
  int rank = 0;
  double step_s = 0;
  double forward_s = 0, backward_s = 0, recompute_s = 0, optimizer_s = 0;
  double compute_busy_s = 0;  // the union of the above (streams may compute side by side)
  std::array<CommTime, kNumCommDimensions> comm{};
  double exposed_comm_s = 0;  // the union of every transfer, minus compute: what communication adds
  double idle_s = 0;          // neither computing nor transferring
};

// `rank` must be recorded (SimResult::timeline_ranks); rank 0 always is.
StepBreakdown step_breakdown(const Schedule& schedule, const SimResult& result, int rank);

// {"rank", "compute_s": {forward, backward, recompute, optimizer, busy}, "comm_s": {dimension: {transfer,
// exposed}} (dimensions with traffic only), "exposed_comm_s", "idle_s"}.
nlohmann::json breakdown_json(const StepBreakdown& b);

// The lines `hzp simulate` prints.
std::string breakdown_text(const StepBreakdown& b, bool pipelined);

}  // namespace hzp::sim
