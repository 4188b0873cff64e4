// Where this rank's model states live: the schedule's units split into segments (one module's parameters of
// one state kind), each padded to a multiple of its groups' sizes, and which piece of each segment this rank
// holds for parameters, gradients and optimizer states — everything derived from the schedule's typed
// fields (Schedule::units, states, buckets), nothing from names.
//
// A state sharded over s ranks keeps the piece at this rank's position in that group. The optimizer slice
// is piece (param position * q + refresh position) of s_os pieces, which lies inside both the parameter shard
// and the gradient shard (sharding.h explains why); build() checks that the groups nest that way.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/model/model.h"
#include "shared/base/status.h"
#include "shared/ir/schedule.h"

namespace hzp::runtime {

// This rank's positions in one state kind's groups.
struct ShardPosition {
  int p = 0;  // in the parameter group (param_shard)
  int g = 0;  // in the gradient group (grad_shard)
  int i = 0;  // in the refresh group (param_refresh): which optimizer slice of the parameter shard
};

// One module's parameters of one state kind.
struct Segment {
  int unit = 0;
  int module = 0;  // module slot in the unit
  StateKind state = StateKind::kDense;
  bool experts = false;  // the experts of a MoE layer (else: a dense module or a router)
  Layout layout;
  std::int64_t n = 0;              // real parameters
  std::int64_t padded = 0;         // a multiple of every group size of its kind
  std::int64_t unit_offset = 0;    // in the unit's gather slot
  std::uint64_t tensor_id = 0;     // initialisation stream (model.h init_parameters)
  std::int64_t first_expert = -1;  // experts segment: global index of its first expert
};

class StateLayout {
 public:
  // `ep_position`: this rank's position in its expert-parallel group (0 without expert parallelism).
  static Result<StateLayout> build(const Schedule& schedule, const ModelConfig& config, int rank, int ep_position);

  const std::vector<Segment>& segments() const { return segs_; }
  const Segment& segment(int s) const { return segs_[s]; }
  const StateSharding& sharding(StateKind k) const { return schedule_states_[static_cast<int>(k)]; }
  const ShardPosition& position(StateKind k) const { return positions_[static_cast<int>(k)]; }
  int secondary_size() const { return secondary_size_; }
  int secondary_position() const { return secondary_pos_; }

  // Floats of segment s this rank keeps resident: its parameter shard, gradient shard, optimizer slice.
  std::int64_t param_floats(int s) const { return segs_[s].padded / sharding(segs_[s].state).s_p; }
  std::int64_t grad_floats(int s) const { return segs_[s].padded / sharding(segs_[s].state).s_g; }
  std::int64_t optimizer_floats(int s) const { return segs_[s].padded / sharding(segs_[s].state).s_os; }
  // Where the optimizer slice starts in the segment's full coordinates, and inside the parameter and the
  // gradient shard.
  std::int64_t optimizer_begin(int s) const;
  std::int64_t optimizer_in_param(int s) const {
    return optimizer_begin(s) - position(segs_[s].state).p * param_floats(s);
  }
  std::int64_t optimizer_in_grad(int s) const {
    return optimizer_begin(s) - position(segs_[s].state).g * grad_floats(s);
  }

  const std::vector<int>& unit_segments(int unit) const { return unit_segs_[unit]; }
  std::int64_t unit_floats(int unit) const { return unit_padded_[unit]; }  // a gather slot for the unit
  std::int64_t max_unit_floats() const;
  // The segment of (unit, module slot) holding experts or not, in `state`; -1 if none.
  int find(int unit, int module, StateKind state, bool experts) const;
  // A bucket's segments with their offsets in its gradient slot, and the slot floats it needs.
  const std::vector<std::pair<int, std::int64_t>>& bucket_segments(int bucket) const { return bucket_segs_[bucket]; }
  std::int64_t bucket_floats(int bucket) const;
  std::int64_t max_bucket_floats() const;
  int bucket_of(int unit, StateKind state) const { return unit_bucket_[unit][static_cast<int>(state)]; }

 private:
  std::array<StateSharding, 2> schedule_states_;
  std::array<ShardPosition, 2> positions_;
  int secondary_size_ = 1, secondary_pos_ = 0;
  std::vector<Segment> segs_;
  std::vector<std::vector<int>> unit_segs_;
  std::vector<std::int64_t> unit_padded_;
  std::vector<std::vector<std::pair<int, std::int64_t>>> bucket_segs_;
  std::vector<std::array<int, 2>> unit_bucket_;
};

}  // namespace hzp::runtime
