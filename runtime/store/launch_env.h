// How a rank process learns who it is: from `hzp train`'s own launcher or from torchrun, Slurm or mpirun.
//
//   rank / world size   RANK, WORLD_SIZE (torchrun, hzp)       SLURM_PROCID, SLURM_NTASKS (srun)
//                       OMPI_COMM_WORLD_RANK, _SIZE (Open MPI) PMI_RANK, PMI_SIZE (MPICH / Intel MPI)
//   local rank          LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID
//   ranks on this host  LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS
//                       (optional: sets the default --gpus-per-node and the threads per rank)
//   store               HZP_STORE_ADDR / HZP_STORE_PORT, else MASTER_ADDR / MASTER_PORT; HZP_STORE_TOKEN
//                       is the shared secret (required). Without hzp's launcher, rank 0 hosts the store.
// The first family whose rank and size are both set wins; partial or malformed values are errors naming the
// variable.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "shared/base/status.h"

namespace hzp::runtime {

struct LaunchEnv {
  std::string source;  // "hzp", "torchrun", "slurm", "openmpi", "pmi"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 0;  // ranks on this host; 0 = not given
  std::string store_host;
  std::uint16_t store_port = 0;
  std::string token;
  bool hosted_by_launcher = false;  // HZP_LAUNCHED=1: the store runs in `hzp train`'s launcher
};

using GetEnv = std::function<const char*(const char*)>;

// nullopt: no launcher variables at all (the process is the launcher).
Result<std::optional<LaunchEnv>> detect_launch_env(const GetEnv& getenv);

// `host` (a name such as "localhost" or "node-3", or an IPv4 address) as an IPv4 address for the store to
// bind and connect to; kInvalidInput naming `what` (e.g. "MASTER_ADDR") when it does not resolve.
Result<std::string> resolve_ipv4(const std::string& host, const std::string& what);

}  // namespace hzp::runtime
