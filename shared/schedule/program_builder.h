// Internal to schedule/: the ops of one program appended with their streams, and the fixed buffer pools'
// slots handed out round-robin. Used by the data-parallel scheduler (schedule_builder.cc, module_ops.cc).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "shared/ir/schedule.h"

namespace hzp::schedule_detail {

// Appends ops to one program; streams are created on first use so unused ones do not appear.
class ProgramBuilder {
 public:
  ProgramBuilder(Schedule& schedule, bool separate_streams) : schedule_(schedule), separate_(separate_streams) {
    stream_index(StreamKind::kCompute);  // stream 0 is always the compute stream
  }
  int add(StreamKind stream, std::vector<int> deps, OpBody body) {
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
    const bool own = separate_ || own_queue(stream);
    program_.ops.push_back(Op{stream_index(own ? stream : StreamKind::kCompute), std::move(deps), std::move(body), {}});
    return static_cast<int>(program_.ops.size()) - 1;
  }
  Program take() { return std::move(program_); }
  Op& op(int index) { return program_.ops[index]; }

 private:
  int stream_index(StreamKind kind) {
    auto it = std::find(schedule_.streams.begin(), schedule_.streams.end(), kind);
    if (it != schedule_.streams.end()) return static_cast<int>(it - schedule_.streams.begin());
    schedule_.streams.push_back(kind);
    return static_cast<int>(schedule_.streams.size()) - 1;
  }
  Schedule& schedule_;
  bool separate_;
  Program program_;
};

// A fixed pool of slots, split into `rings` equal rings each handed out round-robin; a slot's next acquire
// waits for its previous release. Round-robin is only safe when a ring's holders release in the order they
// acquired: gradient buckets of one kind do, but a dense bucket spanning several units outlives expert
// buckets, so each kind of state gets a ring of its own (one shared ring handed a still-held slot).
class SlotPool {
 public:
  SlotPool(int pool, int slots, int rings = 1)
      : pool_(pool), per_ring_(slots / rings), counters_(rings, 0), last_release_(slots, -1) {}
  int pool() const { return pool_; }
  int next_slot(int ring = 0) { return ring * per_ring_ + static_cast<int>(counters_[ring]++ % per_ring_); }
  int last_release(int slot) const { return last_release_[slot]; }
  void set_release(int slot, int op) { last_release_[slot] = op; }

 private:
  int pool_;
  int per_ring_;
  std::vector<long long> counters_;
  std::vector<int> last_release_;
};

}  // namespace hzp::schedule_detail
