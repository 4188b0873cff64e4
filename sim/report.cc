// summary.json and the Perfetto timeline of a simulation.
#include "sim/executor.h"

#include <cstdio>
#include <map>

#include "shared/cost/collective_cost.h"
#include "shared/trace/perfetto.h"

namespace hzp::sim {

nlohmann::json summary_json(const Scenario& scenario, const SimResult& r) {
  const MemoryBreakdown& m = r.memory;
  return {
      {"scenario", scenario.name},
      {"policy", to_string(scenario.policy.preset)},
      {"gpus", r.gpus},
      {"steps", r.steps},
      {"step_time_s", r.step_time_s},
      {"tokens_per_s", r.tokens_per_s},
      {"tokens_per_gpu_per_s", r.tokens_per_gpu_per_s},
      {"mfu", r.mfu},
      {"tflops_per_gpu", r.tflops_per_gpu},
      {"compute_s", r.compute_s},
      {"comm_s", r.comm_s},
      {"exposed_comm_s", r.exposed_comm_s},
      {"overlap_fraction", r.overlap_fraction},
      {"peak_memory_bytes", m.total()},
      {"peak_memory_rank", r.peak_memory_rank},
      {"peak_memory_breakdown_bytes", memory_breakdown_json(m)},
      {"gpu_memory_bytes", scenario.cluster.gpu.memory_bytes},
      {"fits_memory", r.fits_memory},
      {"memory_verdict", r.memory_verdict},
      {"comm_bytes",
       {{"intra_node_per_gpu", r.comm_bytes_intra_node}, {"inter_node_per_gpu", r.comm_bytes_inter_node}}},
      {"sim_wall_s", r.sim_wall_s},
      {"ops_executed", r.ops_executed},
      {"ops_simulated", r.ops_simulated},
      {"symmetric", r.symmetric},
      {"collectives", r.collectives},
      {"collectives_with_flows", r.collectives_with_flows},
      {"events_per_s", r.sim_wall_s > 0 ? r.ops_executed / r.sim_wall_s : 0.0},
      {"sim_estimated_wall_s", r.cost_estimate.seconds},  // sim/cost.h: what the budget was checked against
      {"sim_estimated_resident_bytes", r.cost_estimate.resident_bytes},
      {"timeline_ranks", r.timeline_ranks},
      {"steady_state", r.steady_state.micro_batches == 0
                           ? nlohmann::json(nullptr)
                           : nlohmann::json{{"micro_batches", r.steady_state.micro_batches},
                                            {"period", r.steady_state.period},
                                            {"simulated", {r.steady_state.first, r.steady_state.second}}}},
  };
}

namespace {

std::string op_name(const Schedule& schedule, const Op& op) {
  if (const auto* c = std::get_if<ComputeOp>(&op.body)) return timeline_compute_name(c->module, c->phase, c->layer);
  if (const auto* c = std::get_if<CollectiveOp>(&op.body))
    return timeline_collective_name(to_string(c->kind), c->payload, c->layer);
  if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) return timeline_optimizer_name(o->bucket);
  if (const auto* a = std::get_if<BufferAcquireOp>(&op.body))
    return timeline_buffer_name(true, schedule.pools[a->pool].name, a->layer);
  const auto& r = std::get<BufferReleaseOp>(op.body);
  return timeline_buffer_name(false, schedule.pools[r.pool].name, r.layer);
}

}  // namespace

std::string timeline_text(const Scenario& scenario, const Schedule& schedule, const SimResult& r) {
  PerfettoTimeline timeline;
  std::map<std::pair<int, int>, const char*> algorithm_cache;  // (group, op index) -> algorithm name
  const int R = scenario.cluster.gpus_per_node;
  for (int rank : r.timeline_ranks) {
    // Pipelined, the process name says the stage too (and the timeline groups GPUs by stage).
    const std::string stage = schedule.programs.size() > 1 && scenario.mesh.pipeline > 1
                                  ? ", stage " + std::to_string(schedule.rank_program[rank])
                                  : "";
    std::string name = timeline_gpu_name(rank, R);
    timeline.process(rank, stage.empty() ? name : name.insert(name.size() - 1, stage));
    for (size_t s = 0; s < schedule.streams.size(); ++s)
      timeline.thread(rank, static_cast<int>(s), to_string(schedule.streams[s]));
  }
  for (const OpSpan& span : r.spans) {
    const Op& op = schedule.program_of(span.rank).ops[span.op];
    // A pool slot taken or given back at once is no span; one waited for (a full pool) is, as when recorded.
    const bool buffer_op =
        std::holds_alternative<BufferAcquireOp>(op.body) || std::holds_alternative<BufferReleaseOp>(op.body);
    if (buffer_op && span.end <= span.start) continue;
    SpanArgs args;
    args.add("step", static_cast<long long>(span.step)).add("op", static_cast<long long>(span.op));
    const char* cat = "compute";
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      args.add("flops", c->flops).add("micro_batch", static_cast<long long>(c->micro_batch));
    } else if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      cat = "comm";
      const ProcessGroup& g = schedule.group_of(span.rank, c->role);
      const int group = schedule.rank_groups[span.rank][c->role];
      auto [it, fresh] = algorithm_cache.try_emplace({group, span.op}, nullptr);
      if (fresh)
        it->second = to_string(choose_algorithm(scenario.cluster, c->kind, static_cast<double>(c->bytes),
                                                group_shape(scenario.cluster, g)));
      args.add("bytes", static_cast<long long>(c->bytes))
          .add("group", static_cast<long long>(group))
          .add("group_role", to_string(schedule.roles[c->role]))
          .add("group_size", static_cast<long long>(g.ranks.size()))
          .add("algorithm", it->second)
          .add("wait_for_peers_us", (span.transfer_start - span.start) * 1e6)
          .add("micro_batch", static_cast<long long>(c->micro_batch));
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      args.add("shard_params", static_cast<long long>(o->shard_params))
          .add("bucket", static_cast<long long>(o->bucket));
    }
    timeline.span(span.rank, op.stream, op_name(schedule, op), cat, span.start * 1e6, (span.end - span.start) * 1e6,
                  args);
  }
  return std::move(timeline).to_text({{"scenario", scenario.name},
                                      {"policy", to_string(scenario.policy.preset)},
                                      {"gpus", r.gpus},
                                      {"recorded_ranks", r.timeline_ranks.size()}});
}

}  // namespace hzp::sim
