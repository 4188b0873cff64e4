// Internal to schedule/: the ops of one module's pass on the compute path — its compute op, and the
// collectives parallelism puts around it: tensor parallelism's all-reduces (or, with sequence parallelism,
// all-gathers and reduce-scatters), context parallelism's key / value exchange (ring) or all-to-alls
// (Ulysses), expert parallelism's token all-to-alls. The data-parallel timeline (schedule_builder.cc) calls
// compute() for every module of every visit.
#pragma once

#include <optional>
#include <vector>

#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/schedule/program_builder.h"
#include "shared/schedule/stage_layout.h"

namespace hzp::schedule_detail {

class ModuleOps {
 public:
  ModuleOps(const StageLayout& layout, const Schedule& schedule, ProgramBuilder& prog)
      : layout_(layout), schedule_(schedule), prog_(prog) {}

  // The gather slot the ops of the visit being run read (ComputeOp / CollectiveOp::gather_slot), -1 none.
  void set_visit_slot(int slot) { visit_slot_ = slot; }
  // Module `m`'s pass with what runs around it, after `deps`; returns the op its consumers wait for.
  int compute(const ModuleCost* m, int unit, Phase phase, int mb, std::vector<int> deps);
  // Attention exchanges still running beside the last compute (ring attention): what follows waits for them.
  const std::vector<int>& pending_exchanges() const { return context_tail_; }

 private:
  int all_to_all(CollectivePurpose purpose, int unit, int mb, std::vector<int> deps);
  int tensor_collective(CollectiveKind kind, const ModuleCost* m, int unit, Phase phase, int mb, std::vector<int> deps,
                        std::int64_t bytes, DType dtype, StreamKind stream = StreamKind::kCompute,
                        std::optional<Payload> payload = std::nullopt);
  struct TensorComm {
    bool gather_before = false;
    CollectiveKind after = CollectiveKind::kAllReduce;
    bool reduce_after = false;
    bool loss = false;
    bool regather_input = false;  // sequence parallelism's backward: the input again, for the weight gradient
  };
  TensorComm tensor_comm(ModuleKind kind, Phase phase) const;
  ComputeOp work_of(const ModuleCost* m, int unit, Phase phase, int mb) const;
  void context_exchange(const ModuleCost* m, int unit, Phase phase, int mb, const std::vector<int>& deps);
  bool ulysses_applies(const ModuleCost* m, Phase phase) const;
  int ulysses_all_to_all(int unit, Phase phase, int mb, bool before, std::vector<int> deps);

  const StageLayout& layout_;
  const Schedule& schedule_;
  ProgramBuilder& prog_;
  // Exchanges running beside the last compute that the next compute must wait for: ring attention's
  // (context_exchange) and an overlapped tensor all-gather no reduce-scatter follows.
  std::vector<int> context_tail_;
  int visit_slot_ = -1;
};

}  // namespace hzp::schedule_detail
