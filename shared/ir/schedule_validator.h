// Proves a schedule can run: structure, buffer pools, and — the one that matters — that every group's
// members issue the same collectives in the same order and that no mix of stream order, dependencies and
// collective matching can leave ranks waiting on each other forever.
#pragma once

#include "shared/base/status.h"
#include "shared/ir/schedule.h"

namespace hzp {

// kInternal with a message naming the rank, op and group on the first problem found, Ok otherwise.
//  1. structure: deps point to earlier ops, stream / role / pool / slot indices exist, every rank is a
//     member of the group its roles bind it to;
//  2. pools: a slot is acquired only when free and released only when held, in program order, and each
//     acquire depends on the previous release of its slot;
//  3. collective order: for each group, every member's sequence of collectives on it is identical
//     (kind, bytes, dtype, payload, layer, micro-batch) — a mismatch is a deadlock (NCCL matches collectives by issue
//     order);
//  4. progress: an abstract execution (zero durations; a collective completes when every member has
//     reached it at the head of its stream) runs every op. One rank per distinct program is executed (ranks
//     sharing a program are interchangeable, so they move as its representative does); a single shared
//     program is executed once, since identical ranks move in lock-step.
Status validate_schedule(const Schedule& schedule);

}  // namespace hzp
