// This rank's model-state layout (state_layout.h).
#include "runtime/train/state_layout.h"

#include <algorithm>
#include <numeric>

namespace hzp::runtime {
namespace {

std::int64_t round_up(std::int64_t x, std::int64_t m) {
  return (x + m - 1) / m * m;
}

int position_in(const ProcessGroup& g, int rank) {
  auto it = std::find(g.ranks.begin(), g.ranks.end(), rank);
  return it == g.ranks.end() ? -1 : static_cast<int>(it - g.ranks.begin());
}

}  // namespace

Result<StateLayout> StateLayout::build(const Schedule& schedule, const ModelConfig& cfg, int rank, int ep_position) {
  StateLayout out;
  out.schedule_states_ = schedule.states;
  for (StateKind k : {StateKind::kDense, StateKind::kExpert}) {
    const StateSharding& st = schedule.state(k);
    if (!st.present) continue;
    ShardPosition& pos = out.positions_[static_cast<int>(k)];
    pos.p = position_in(schedule.group_of(rank, st.role_param), rank);
    pos.g = position_in(schedule.group_of(rank, st.role_grad), rank);
    pos.i = position_in(schedule.group_of(rank, st.role_refresh), rank);
    // The layout promises nested pieces (sharding.h); check it rather than train on a mismatch.
    const int expected_g = st.s_g == st.s_os ? pos.p * st.q() + pos.i : pos.p;
    if (!(st.s_g == st.s_p || st.s_g == st.s_os) || pos.g != expected_g)
      return Status::Internal(std::string("runtime: ") + to_string(k) + " grad_shard position " +
                              std::to_string(pos.g) + " does not nest with the parameter/optimizer pieces on rank " +
                              std::to_string(rank));
  }
  if (!schedule.state(StateKind::kDense).present) return Status::Internal("runtime: the schedule has no dense states");
  const bool ep = schedule.state(StateKind::kExpert).present;
  if (schedule.role_secondary >= 0) {
    const ProcessGroup& g = schedule.group_of(rank, schedule.role_secondary);
    out.secondary_size_ = static_cast<int>(g.ranks.size());
    out.secondary_pos_ = position_in(g, rank);
  }

  // Segments, unit by unit, module slot by module slot, as the schedule's units list them.
  const int units = static_cast<int>(schedule.units.size());
  out.unit_segs_.assign(units, {});
  out.unit_padded_.assign(units, 0);
  auto add = [&](int unit, int module, StateKind state, bool experts, Layout layout, std::int64_t first_expert) {
    Segment s;
    s.unit = unit;
    s.module = module;
    s.state = state;
    s.experts = experts;
    s.layout = std::move(layout);
    s.n = layout_size(s.layout);
    std::int64_t multiple = out.sharding(state).s_os;
    if (state == StateKind::kDense && schedule.role_secondary >= 0)
      multiple = std::lcm<std::int64_t>(multiple, out.secondary_size_);
    s.padded = round_up(s.n, multiple);
    s.unit_offset = out.unit_padded_[unit];
    out.unit_padded_[unit] += s.padded;
    s.tensor_id = static_cast<std::uint64_t>(unit) * 8 + module * 2 + (experts ? 1 : 0);
    s.first_expert = first_expert;
    out.unit_segs_[unit].push_back(static_cast<int>(out.segs_.size()));
    out.segs_.push_back(std::move(s));
  };
  for (int u = 0; u < units; ++u) {
    const UnitInfo& info = schedule.units[u];
    for (std::size_t m = 0; m < info.modules.size(); ++m) {
      const int slot = static_cast<int>(m);
      switch (info.modules[m]) {
        case ModuleKind::kEmbedding:
          add(u, slot, StateKind::kDense, false, embedding_layout(cfg), -1);
          break;
        case ModuleKind::kAttention:
          add(u, slot, StateKind::kDense, false, attention_layout(cfg), -1);
          break;
        case ModuleKind::kMlp:
          add(u, slot, StateKind::kDense, false, mlp_layout(cfg), -1);
          break;
        case ModuleKind::kHead:
          add(u, slot, StateKind::kDense, false, head_layout(cfg), -1);
          break;
        case ModuleKind::kMoe: {
          add(u, slot, StateKind::kDense, false, moe_router_layout(cfg), -1);
          const std::int64_t local =
              ep ? cfg.experts / schedule.group_of(rank, schedule.role_expert_parallel).ranks.size() : cfg.experts;
          add(u, slot, ep ? StateKind::kExpert : StateKind::kDense, true, experts_layout(cfg, local),
              ep_position * local);
          break;
        }
      }
    }
  }

  // Buckets as the schedule defines them: units in backward order, each unit's segments of the bucket's kind.
  out.unit_bucket_.assign(units, {-1, -1});
  out.bucket_segs_.assign(schedule.buckets.size(), {});
  for (std::size_t b = 0; b < schedule.buckets.size(); ++b) {
    const GradBucket& gb = schedule.buckets[b];
    std::int64_t offset = 0;
    for (int u : gb.units) {
      if (u < 0 || u >= units) return Status::Internal("runtime: bucket names unit " + std::to_string(u));
      out.unit_bucket_[u][static_cast<int>(gb.state)] = static_cast<int>(b);
      for (int s : out.unit_segs_[u]) {
        if (out.segs_[s].state != gb.state) continue;
        out.bucket_segs_[b].push_back({s, offset});
        offset += out.segs_[s].padded;
      }
    }
  }
  for (const Segment& s : out.segs_)
    if (out.unit_bucket_[s.unit][static_cast<int>(s.state)] < 0)
      return Status::Internal("runtime: unit " + std::to_string(s.unit) + " has parameters in no bucket");
  return out;
}

std::int64_t StateLayout::optimizer_begin(int s) const {
  const ShardPosition& pos = position(segs_[s].state);
  return (static_cast<std::int64_t>(pos.p) * sharding(segs_[s].state).q() + pos.i) * optimizer_floats(s);
}

std::int64_t StateLayout::max_unit_floats() const {
  return unit_padded_.empty() ? 0 : *std::max_element(unit_padded_.begin(), unit_padded_.end());
}

int StateLayout::find(int unit, int module, StateKind state, bool experts) const {
  for (int s : unit_segs_[unit])
    if (segs_[s].module == module && segs_[s].state == state && segs_[s].experts == experts) return s;
  return -1;
}

std::int64_t StateLayout::bucket_floats(int bucket) const {
  std::int64_t size = 0;
  for (const auto& [s, off] : bucket_segs_[bucket]) size = std::max(size, off + segs_[s].padded);
  return size;
}

std::int64_t StateLayout::max_bucket_floats() const {
  std::int64_t m = 0;
  for (std::size_t b = 0; b < bucket_segs_.size(); ++b) m = std::max(m, bucket_floats(static_cast<int>(b)));
  return m;
}

}  // namespace hzp::runtime
