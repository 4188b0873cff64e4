// Sharded checkpoints of the runtime: the file format, its validation, and the checkpoint directory.
//
// Layout: DIR/step_<S>/rank_<r>.bin per rank, DIR/latest holding S once every rank's file is in place,
// DIR/.lock held by the job writing DIR. A rank file is one JSON header line, then the raw little-endian
// fp32 payload: for each segment, the parameter shard (16-bit values widened exactly), in 16-bit training the
// fp32 master of the optimizer slice, Adam m and Adam v. The header says which layout wrote it (world size,
// rank, policy, precision, per-segment sizes), the step to resume at, the fp16 loss scaler's state, and a
// checksum of the payload:
//   {"format": "hzp-checkpoint-v2", "rank": r, "world_size": n, "policy": "zero3", "precision": "bf16",
//    "next_step": S, "adam_steps": S, "loss_scale": 65536, "loss_scale_good_steps": 0,
//    "segments": [[param_floats, optimizer_floats], ...], "payload_bytes": B,
//    "payload_fnv1a64": "0123456789abcdef", "layout": {"gpus_per_node": R, "policy": {...}, "model": {...}}}
// ("layout", optional, lets another layout resume it: reshard.h).
// A v1 file (written before mixed precision) has no precision or loss-scale fields: it is an fp32 state.
// Every field is checked on load (type, range, agreement with the running layout), the payload must be
// exactly B bytes with that checksum, and every value finite: a damaged or foreign file is kInvalidInput
// (exit 2) naming the file and the field, never a crash, and a NaN state is refused on save and on load.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"

namespace hzp::runtime {

inline constexpr const char* kCheckpointFormat = "hzp-checkpoint-v2";
inline constexpr const char* kCheckpointFormatV1 = "hzp-checkpoint-v1";
inline constexpr std::size_t kMaxCheckpointHeaderBytes = 1 << 20;

struct CheckpointHeader {
  int rank = 0;
  int world_size = 0;
  std::string policy;
  std::string precision = "fp32";  // training.precision: "fp32", "bf16" or "fp16"
  std::int64_t next_step = 0;
  std::int64_t adam_steps = 0;
  double loss_scale = 1;                                        // fp16's dynamic loss scale (1 otherwise)
  std::int64_t loss_scale_good_steps = 0;                       // steps since its last change
  std::vector<std::pair<std::int64_t, std::int64_t>> segments;  // (parameter floats, optimizer floats)
  std::int64_t payload_bytes = 0;
  std::uint64_t checksum = 0;
  // What rebuilds the writer's layout, so that another world size or policy can resume from it (reshard.h):
  // {"gpus_per_node": R, "policy": the resolved policy section}. Null in files written before it.
  nlohmann::json layout;

  nlohmann::json to_json() const;
  // The same world, rank, policy and segments: the payload maps one to one onto the running state.
  bool same_layout(const CheckpointHeader& other) const {
    return world_size == other.world_size && rank == other.rank && policy == other.policy && segments == other.segments;
  }
};

// Parses and type-checks a header line (without its newline). Errors name the field and value.
Result<CheckpointHeader> parse_checkpoint_header(const std::string& line);

// One contiguous run of floats of the payload, in file order.
struct FloatSpan {
  float* data;
  std::int64_t count;
};

// Writes `header` (payload_bytes and checksum are filled in here) and the spans to `path` atomically and
// durably (PATH.tmp, fsync, rename, fsync of the directory). Refuses a state holding NaN or Inf.
Status write_checkpoint(const std::string& path, CheckpointHeader header, const std::vector<FloatSpan>& spans);

// The header line of `path` alone, parsed (for a reader that must learn the layout before the payload).
Result<CheckpointHeader> read_checkpoint_header(const std::string& path);

// The payload of `path` as its own header lays it out: per segment the parameter shard, the fp32 master (16-bit
// training), Adam m and v; checked as read_checkpoint checks it.
Result<std::vector<std::vector<float>>> read_checkpoint_payload(const std::string& path, const CheckpointHeader& header,
                                                                std::int64_t max_step);

// Reads `path` into the spans after checking it against `expected` (rank, world size, policy, segments)
// precision) and `max_step` (next_step must be in [0, max_step]); returns the header.
Result<CheckpointHeader> read_checkpoint(const std::string& path, const CheckpointHeader& expected,
                                         std::int64_t max_step, const std::vector<FloatSpan>& spans);

// DIR/latest: the step of the newest complete checkpoint (kInvalidInput when missing or malformed).
Result<std::int64_t> read_latest(const std::string& dir);
Status write_latest(const std::string& dir, std::int64_t step);
std::string checkpoint_file(const std::string& dir, std::int64_t step, int rank);

// Exclusive use of a checkpoint directory by one job for its lifetime (flock on DIR/.lock, which records
// the holder's pid and host): a second job writing the same directory is refused with a message naming
// the holder. Taking the lock also removes *.tmp files that crashed writers left behind.
class CheckpointDirLock {
 public:
  static Result<std::unique_ptr<CheckpointDirLock>> acquire(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  explicit CheckpointDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace hzp::runtime
