#include "runtime/store/launch_env.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <charconv>
#include <cstring>

#include "shared/base/text.h"

namespace hzp::runtime {
namespace {

Result<long long> read_int(const GetEnv& getenv, const char* name, long long min, long long max) {
  const char* v = getenv(name);
  long long x = 0;
  const char* end = v + std::strlen(v);
  auto [ptr, ec] = std::from_chars(v, end, x);
  if (ec != std::errc() || ptr != end || x < min || x > max)
    return Status::InvalidInput(std::string("environment: ") + name + "=" + quoted(v, 60) + " is not an integer in [" +
                                std::to_string(min) + ", " + std::to_string(max) + "]");
  return x;
}

}  // namespace

Result<std::optional<LaunchEnv>> detect_launch_env(const GetEnv& getenv) {
  struct Family {
    const char* source;
    const char* rank;
    const char* size;
    const char* local;
    const char* local_size;
  };
  static const Family kFamilies[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
  };
  for (const Family& f : kFamilies) {
    const bool has_rank = getenv(f.rank) != nullptr, has_size = getenv(f.size) != nullptr;
    if (!has_rank && !has_size) continue;
    if (!has_rank || !has_size)
      return Status::InvalidInput(std::string("environment: ") + (has_rank ? f.size : f.rank) + " is missing while " +
                                  (has_rank ? f.rank : f.size) + " is set");
    LaunchEnv env;
    env.source = f.source;
    HZP_ASSIGN_OR_RETURN(long long size, read_int(getenv, f.size, 1, 1 << 20));
    HZP_ASSIGN_OR_RETURN(long long rank, read_int(getenv, f.rank, 0, size - 1));
    env.world_size = static_cast<int>(size);
    env.rank = static_cast<int>(rank);
    if (getenv(f.local) != nullptr) {
      HZP_ASSIGN_OR_RETURN(long long local, read_int(getenv, f.local, 0, size - 1));
      env.local_rank = static_cast<int>(local);
    }
    if (const char* lws = getenv(f.local_size); lws != nullptr) {
      // Slurm writes SLURM_NTASKS_PER_NODE as "4" or, for uneven allocations, "4(x2),3": the first count.
      std::string first(lws);
      first = first.substr(0, first.find_first_of("(,"));
      const char* digits = first.c_str();
      GetEnv one = [&](const char* name) { return std::strcmp(name, f.local_size) == 0 ? digits : getenv(name); };
      HZP_ASSIGN_OR_RETURN(long long local_size, read_int(one, f.local_size, 1, size));
      env.local_world_size = static_cast<int>(local_size);
    }
    const char* host_var = getenv("HZP_STORE_ADDR") ? "HZP_STORE_ADDR" : "MASTER_ADDR";
    const char* port_var = getenv("HZP_STORE_PORT") ? "HZP_STORE_PORT" : "MASTER_PORT";
    if (getenv(host_var) == nullptr)
      return Status::InvalidInput(std::string("environment: ") + f.rank + " is set (" + f.source +
                                  ") but neither HZP_STORE_ADDR nor MASTER_ADDR says where the store is");
    if (getenv(port_var) == nullptr)
      return Status::InvalidInput("environment: neither HZP_STORE_PORT nor MASTER_PORT gives the store's port");
    env.store_host = getenv(host_var);
    HZP_ASSIGN_OR_RETURN(long long port, read_int(getenv, port_var, 1, 65535));
    env.store_port = static_cast<std::uint16_t>(port);
    if (getenv("HZP_STORE_TOKEN") == nullptr || std::strlen(getenv("HZP_STORE_TOKEN")) == 0)
      return Status::InvalidInput("environment: HZP_STORE_TOKEN (the store's shared secret) must be set for " +
                                  std::string(f.source) + " launches");
    // A secret one can guess is none: at least 16 characters (`openssl rand -hex 16` gives 32).
    constexpr std::size_t kMinTokenChars = 16;
    std::size_t chars = 0;  // UTF-8 characters: bytes that do not continue one
    for (const char* c = getenv("HZP_STORE_TOKEN"); *c != '\0'; ++c)
      chars += (static_cast<unsigned char>(*c) & 0xC0) != 0x80 ? 1 : 0;
    if (chars < kMinTokenChars)
      return Status::InvalidInput("environment: HZP_STORE_TOKEN has " + std::to_string(chars) +
                                  " characters; a shared secret needs at least 16 (openssl rand -hex 16)");
    env.token = getenv("HZP_STORE_TOKEN");
    env.hosted_by_launcher = getenv("HZP_LAUNCHED") != nullptr && std::strcmp(getenv("HZP_LAUNCHED"), "1") == 0;
    if (env.hosted_by_launcher) env.source = "hzp";
    return std::optional<LaunchEnv>(env);
  }
  return std::optional<LaunchEnv>();
}

Result<std::string> resolve_ipv4(const std::string& host, const std::string& what) {
  in_addr literal{};
  if (::inet_pton(AF_INET, host.c_str(), &literal) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr)
    return Status::InvalidInput(what + "=" + quoted(host, 100) + " does not resolve to an IPv4 address (" +
                                ::gai_strerror(rc) + ")");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(found);
  return std::string(text);
}

}  // namespace hzp::runtime
