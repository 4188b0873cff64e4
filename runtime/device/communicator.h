// Collectives over one process group, on typed device buffers (device.h), called from the work of the
// stream the communicator was made for (a CUDA backend binds its ncclComm to that stream).
//
// Positions are the group's rank order (0..size-1). Sizes come from the buffers: every call checks that
// they agree and that the types match, and says which buffer is wrong. Reductions sum; they accept the
// floating types and int64 (wrapping on overflow; a backend that reduces a 16-bit type through fp32 says so
// in its header). In-place use is allowed where a call says so; any other overlap of `in` and `out` is
// undefined (the CPU backend stages such buffers, another backend need not).
// Every wait is bounded by the communicator's timeout: a dead peer is an error naming the operation and the
// group, not a hang.
#pragma once

#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "shared/base/status.h"

namespace hzp::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // my position in the group
  virtual int size() const = 0;
  virtual const std::vector<int>& global_ranks() const = 0;  // group position -> global rank
  virtual const std::string& name() const = 0;               // e.g. "param_shard[0,1,2,3] on stream ..."

  // out[size * n] = every position's in[n], in position order. `in` may be out.slice(rank() * n, n).
  virtual Status all_gather(const Buffer& in, const Buffer& out) = 0;
  // in[size * n] summed over positions; out[n] = chunk rank() of the sum. out may be in.slice(rank() * n, n).
  virtual Status reduce_scatter(const Buffer& in, const Buffer& out) = 0;
  // In place: data = the sum over positions.
  virtual Status all_reduce(const Buffer& data) = 0;
  // In place: data = position root's data.
  virtual Status broadcast(const Buffer& data, int root) = 0;
  // in[size * n]: chunk j goes to position j; out[size * n]: chunk j came from position j.
  virtual Status all_to_all(const Buffer& in, const Buffer& out) = 0;
  // Variable sizes. send_counts and recv_counts are int64 device buffers of size() element counts: chunk j
  // of `in` (consecutive, in position order) goes to position j, and chunk j of `out` (consecutive) comes
  // from position j. The caller learns recv_counts first, with a small all_to_all of the send counts (as
  // NCCL users do), so no count crosses to the host; out.count is a capacity that must hold them all.
  virtual Status all_to_all_v(const Buffer& in, const Buffer& send_counts, const Buffer& out,
                              const Buffer& recv_counts) = 0;
  virtual Status barrier() = 0;
};

}  // namespace hzp::runtime
