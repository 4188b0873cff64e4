// `hzp train --nproc N`: the local launcher. Starts the rendezvous store (127.0.0.1, random port, random
// token), spawns N copies of this binary as ranks (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
// HZP_STORE_TOKEN, HZP_LAUNCHED=1) and supervises them: the first rank to die abnormally is published in
// the store ("hzp/lost") so that the others name it in their errors, the survivors get `timeout + 15 s` to
// exit, stragglers are killed, and the launcher exits non-zero with a summary of every rank's fate.
#pragma once

#include <string>
#include <vector>

#include "runtime/train/trainer.h"

namespace hzp::runtime {

// `argv_tail` are the arguments after "hzp train" (passed unchanged to every rank).
int launch_local(const TrainOptions& options, const std::vector<std::string>& argv_tail);

}  // namespace hzp::runtime
