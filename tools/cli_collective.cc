// `hzp collective`: one collective over a range of sizes on the simulated cluster, printed like
// nccl-tests (size, time, algorithm and bus bandwidth), with the closed form of shared/cost/collective_cost.h
// beside each simulated time.
#include "tools/cli_collective.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Engine.hpp>

#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/cost/collective_cost.h"
#include "shared/scenario/scenario_parser.h"
#include "sim/collective.h"
#include "sim/platform.h"
#include "tools/cli_flags.h"

namespace hzp::cli {

const char* const kCollectiveHelp =
    "usage: hzp collective --cluster PRESET|FILE.json --op OP --group GROUP --bytes MIN[:MAX]\n"
    "                      [--nodes N] [--algorithm ALGO] [--protocol PROTO]\n\n"
    "Simulates one collective on the SimGrid model of a cluster for sizes MIN, 2·MIN, 4·MIN, ... <= MAX and\n"
    "prints an nccl-tests-style table: size(B), time_us, algbw_GBps (size / time), busbw_GBps (algbw x the\n"
    "nccl-tests factor: all_reduce 2(p-1)/p, all_gather / reduce_scatter / all_to_all (p-1)/p, broadcast 1),\n"
    "model_us (the closed form of shared/cost/collective_cost.h) and the algorithm/protocol used. Sizes follow "
    "nccl-tests:\n"
    "all_gather output, reduce_scatter input, all_reduce / broadcast buffer, all_to_all send buffer.\n\n"
    "  --cluster PRESET|FILE.json  a cluster preset (dgx-a100, a800, dgx-h100, h800, npu-16) or a JSON file\n"
    "                              holding a cluster object (format: scenarios/README.md)\n"
    "  --op OP                     all_gather | reduce_scatter | all_reduce | all_to_all | broadcast\n"
    "  --group GROUP               node: the GPUs of node 0; all: every GPU; N: the first N GPUs (whole\n"
    "                              nodes when N exceeds the GPUs of one node)\n"
    "  --bytes MIN[:MAX]           sizes in bytes, 1 to 1T; suffixes K, M, G, T = 2^10, 2^20, 2^30, 2^40\n"
    "                              (e.g. 1K:1G)\n"
    "  --nodes N                   nodes of the cluster; default: the cluster file's, else just enough for\n"
    "                              the group (all: 2). The cluster may have at most 65536 GPUs.\n"
    "  --algorithm ALGO            auto (default: NCCL-like selection per size) | ring | direct |\n"
    "                              hierarchical | pairwise; a forced algorithm must apply to the group\n"
    "  --protocol PROTO            auto (default: the cluster's, normally NCCL's fastest per size) | ll | ll128 |\n"
    "                              simple, as NCCL_PROTO (ring and hierarchical; direct and pairwise use simple)\n\n"
    "Exit codes: 0 ok, 2 bad arguments or cluster, 1 internal error.\n";

namespace {
namespace sg4 = simgrid::s4u;

int usage_error(const std::string& message) {
  std::fprintf(stderr, "hzp collective: %s (see hzp collective --help)\n", message.c_str());
  return 2;
}

int fail(const Status& status) {
  std::fprintf(stderr, "hzp: error: %s\n", status.message().c_str());
  return status.code() == StatusCode::kInvalidInput ? 2 : 1;
}

// The flags' ranges (documented in the help text).
constexpr long long kMaxBytes = 1LL << 40;       // 1 TiB: beyond any real message
constexpr long long kMaxCollectiveGpus = 65536;  // the simulated cluster's GPUs

// "64K" -> 65536; K/M/G are powers of 2^10, as nccl-tests reads them. In [1, kMaxBytes].
Result<long long> parse_size(const std::string& text) {
  const std::string bad = "--bytes: expected a size from 1 to 1T like 1024, 64K, 8M or 1G, got " + quoted(text, 40);
  if (text.empty()) return Status::InvalidInput(bad);
  long long scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      scale = 1LL << 10;
      break;
    case 'M':
    case 'm':
      scale = 1LL << 20;
      break;
    case 'G':
    case 'g':
      scale = 1LL << 30;
      break;
    case 'T':
    case 't':
      scale = 1LL << 40;
      break;
    default:
      break;
  }
  if (scale > 1) digits.pop_back();
  auto v = parse_int_flag("--bytes", digits, 1, kMaxBytes / scale);
  if (!v.ok()) return Status::InvalidInput(bad);
  return *v * scale;
}

Result<CollectiveKind> parse_op(const std::string& text) {
  for (CollectiveKind k : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce,
                           CollectiveKind::kAllToAll, CollectiveKind::kBroadcast})
    if (text == to_string(k)) return k;
  return Status::InvalidInput("--op: expected all_gather, reduce_scatter, all_reduce, all_to_all or broadcast, got " +
                              quoted(text, 40));
}

// nullopt = auto.
Result<std::optional<CollectiveAlgorithm>> parse_algorithm(const std::string& text) {
  if (text == "auto") return std::optional<CollectiveAlgorithm>();
  for (CollectiveAlgorithm a : {CollectiveAlgorithm::kRing, CollectiveAlgorithm::kDirect,
                                CollectiveAlgorithm::kHierarchical, CollectiveAlgorithm::kPairwise})
    if (text == to_string(a)) return std::optional<CollectiveAlgorithm>(a);
  return Status::InvalidInput("--algorithm: expected auto, ring, direct, hierarchical or pairwise, got " +
                              quoted(text, 40));
}

// nccl-tests' bus bandwidth factor: what each rank's busiest link carries relative to the buffer.
double bus_factor(CollectiveKind kind, int p) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (p - 1) / p;
    case CollectiveKind::kBroadcast:
      return 1;
    default:
      return static_cast<double>(p - 1) / p;
  }
}

// The cluster object: a preset name or the contents of a JSON file.
Result<nlohmann::json> cluster_json(const std::string& arg) {
  if (arg.size() < 5 || arg.compare(arg.size() - 5, 5, ".json") != 0) return nlohmann::json{{"preset", arg}};
  auto doc = load_json_file(arg, kMaxScenarioBytes);
  if (!doc.ok()) return Status::InvalidInput("--cluster: " + doc.status().message());
  if (!doc->is_object()) return Status::InvalidInput("--cluster: " + printable(arg, 200) + " is not a JSON object");
  return doc;
}

struct Options {
  std::string cluster;
  std::optional<long long> nodes;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::string group;
  long long min_bytes = 0;
  long long max_bytes = 0;
  std::optional<CollectiveAlgorithm> algorithm;
  std::optional<ProtocolChoice> protocol;
};

Result<Options> parse_options(const std::vector<std::string>& args) {
  HZP_ASSIGN_OR_RETURN(ParsedArgs a, parse_flags(args,
                                                 {{"--cluster", true},
                                                  {"--nodes", true},
                                                  {"--op", true},
                                                  {"--group", true},
                                                  {"--bytes", true},
                                                  {"--algorithm", true},
                                                  {"--protocol", true}},
                                                 0));
  for (const char* required : {"--cluster", "--op", "--group", "--bytes"})
    if (!a.has(required)) return Status::InvalidInput(std::string("missing ") + required);
  Options o;
  o.cluster = *a.get("--cluster");
  o.group = *a.get("--group");
  if (auto v = a.get("--nodes")) {
    HZP_ASSIGN_OR_RETURN(o.nodes, parse_int_flag("--nodes", *v, 1, kMaxCollectiveGpus));
  }
  HZP_ASSIGN_OR_RETURN(o.kind, parse_op(*a.get("--op")));
  const std::string bytes = *a.get("--bytes");
  const size_t colon = bytes.find(':');
  HZP_ASSIGN_OR_RETURN(o.min_bytes, parse_size(bytes.substr(0, colon)));
  o.max_bytes = o.min_bytes;
  if (colon != std::string::npos) {
    HZP_ASSIGN_OR_RETURN(o.max_bytes, parse_size(bytes.substr(colon + 1)));
  }
  if (o.max_bytes < o.min_bytes)
    return Status::InvalidInput("--bytes: MAX (" + bytes.substr(colon + 1) + ") is below MIN");
  if (auto v = a.get("--algorithm")) {
    HZP_ASSIGN_OR_RETURN(o.algorithm, parse_algorithm(*v));
  }
  if (auto v = a.get("--protocol")) {
    for (ProtocolChoice p :
         {ProtocolChoice::kAuto, ProtocolChoice::kLL, ProtocolChoice::kLL128, ProtocolChoice::kSimple})
      if (*v == to_string(p)) o.protocol = p;
    if (!o.protocol)
      return Status::InvalidInput("--protocol: expected auto, ll, ll128 or simple, got " + quoted(*v, 40));
  }
  return o;
}

// The group's ranks on the built cluster, from --group.
Result<std::vector<int>> group_ranks(const Options& o, const ClusterSpec& c) {
  const int R = c.gpus_per_node;
  int size = 0;
  if (o.group == "node") {
    size = R;
  } else if (o.group == "all") {
    size = c.world_size();
  } else {
    HZP_ASSIGN_OR_RETURN(const long long n, parse_int_flag("--group", o.group, 1, kMaxCollectiveGpus));
    if (n > c.world_size())
      return Status::InvalidInput("--group: " + o.group + " GPUs exceed the cluster's " +
                                  std::to_string(c.world_size()) + " (" + std::to_string(c.nodes) + " nodes x " +
                                  std::to_string(R) + ")");
    if (n > R && n % R != 0)
      return Status::InvalidInput("--group: " + o.group + " GPUs must fill whole nodes of " + std::to_string(R) +
                                  " GPUs when they span nodes");
    size = static_cast<int>(n);
  }
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return ranks;
}

// Nodes the cluster gets: --nodes, else just enough for the group (`all`: 2).
Result<long long> nodes_for(const Options& o, int gpus_per_node) {
  long long needed = 1;
  if (o.group == "all") {
    needed = 2;
  } else if (o.group != "node") {
    HZP_ASSIGN_OR_RETURN(const long long n, parse_int_flag("--group", o.group, 1, kMaxCollectiveGpus));
    needed = (n + gpus_per_node - 1) / gpus_per_node;
  }
  if (!o.nodes) return needed;
  if (o.group != "all" && *o.nodes < needed)
    return Status::InvalidInput("--nodes: " + std::to_string(*o.nodes) + " nodes of " + std::to_string(gpus_per_node) +
                                " GPUs cannot hold --group " + o.group);
  return *o.nodes;
}

// The cluster, validated and calibrated exactly as a scenario's: a minimal scenario around it.
Result<ClusterSpec> parse_cluster(const nlohmann::json& cluster) {
  nlohmann::json doc = {{"model", {{"preset", "tiny-dense"}}},
                        {"training", {{"seq_len", 128}, {"micro_batch", 1}}},
                        {"policy", {{"preset", "ddp"}}}};
  doc["cluster"] = cluster;
  HZP_ASSIGN_OR_RETURN(Scenario scenario, parse_scenario(doc, "collective"));
  return scenario.cluster;
}

std::string count_of(long long n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

struct Row {
  long long bytes = 0;
  double seconds = 0;
  double model_seconds = 0;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;
};

}  // namespace

int run_collective_command(const std::vector<std::string>& args) {
  auto options = parse_options(args);
  if (!options.ok()) return usage_error(options.status().message());
  const Options& o = *options;
  auto json = cluster_json(o.cluster);
  if (!json.ok()) return fail(json.status());
  auto probe = parse_cluster(*json);  // the preset's GPUs per node decide the default node count
  if (!probe.ok()) return fail(probe.status());
  Options sized = o;  // a cluster file's own "nodes" counts as --nodes unless --nodes is given
  if (!sized.nodes && json->contains("nodes") && (*json)["nodes"].is_number_integer())
    sized.nodes = (*json)["nodes"].get<long long>();
  auto nodes = nodes_for(sized, probe->gpus_per_node);
  if (!nodes.ok()) return usage_error(nodes.status().message());
  (*json)["nodes"] = *nodes;
  // --protocol goes through the parser like a file's own: LL on an uncalibrated GPU needs its arch.
  if (o.protocol) (*json)["protocol"] = to_string(*o.protocol);
  auto loaded = parse_cluster(*json);
  if (!loaded.ok()) return fail(loaded.status());
  ClusterSpec cluster = std::move(loaded).value();
  if (cluster.world_size() > kMaxCollectiveGpus)
    return usage_error("the cluster has " + std::to_string(cluster.world_size()) +
                       " GPUs; hzp collective simulates at most " + std::to_string(kMaxCollectiveGpus));
  auto ranks = group_ranks(o, cluster);
  if (!ranks.ok()) return usage_error(ranks.status().message());
  ProcessGroup group;
  group.ranks = std::move(ranks).value();
  const GroupShape shape = group_shape(cluster, group);
  group.ranks_per_node = shape.ranks_per_node;
  group.nodes = shape.nodes;
  group.intra_node = shape.nodes == 1;
  const int p = shape.size();
  if (o.algorithm && !algorithm_applies(cluster, *o.algorithm, o.kind, shape))
    return usage_error(std::string("--algorithm ") + to_string(*o.algorithm) + " does not apply to " +
                       to_string(o.kind) + " over " + count_of(shape.ranks_per_node, "GPU") + " on each of " +
                       count_of(shape.nodes, "node") + " of " + cluster.name +
                       ": ring, direct (one full-mesh node), hierarchical (several GPUs on "
                       "several nodes) and pairwise (all_to_all only) apply as shared/cost/collective_cost.h says");

  std::vector<Row> rows;
  for (long long bytes = o.min_bytes;; bytes *= 2) {
    const double b = static_cast<double>(bytes);
    const CollectiveAlgorithm a = o.algorithm ? *o.algorithm : choose_algorithm(cluster, o.kind, b, shape);
    const NcclProtocol proto = choose_protocol(cluster, a, o.kind, b, shape);
    rows.push_back({bytes, 0, algorithm_time(cluster, a, o.kind, b, shape, proto), a, proto});
    if (bytes > o.max_bytes / 2) break;
  }

  // One SimGrid engine per process: every size runs in one simulation, one after the other.
  int argc = 2;
  char arg0[] = "hzp";
  char arg1[] = "--log=root.thresh:warning";
  char* argv[] = {arg0, arg1, nullptr};
  sg4::Engine engine(&argc, argv);
  sim::configure_engine(engine);
  auto platform = sim::build_platform(engine, cluster);
  if (!platform.ok()) return fail(platform.status());
  sg4::Actor::create("collective", platform->gpus[group.ranks.front()], [&] {
    for (Row& row : rows) {
      const double start = sg4::Engine::get_clock();
      sim::run_collective(*platform, {o.kind, static_cast<double>(row.bytes), &group, row.algorithm, row.protocol});
      row.seconds = sg4::Engine::get_clock() - start;
    }
  });
  engine.run();

  std::printf("# hzp collective: %s over %s (%d per node on %s) of %s: %s of %d x %s\n", to_string(o.kind),
              count_of(p, "GPU").c_str(), shape.ranks_per_node, count_of(shape.nodes, "node").c_str(),
              cluster.name.c_str(), count_of(cluster.nodes, "node").c_str(), cluster.gpus_per_node,
              cluster.gpu.type.c_str());
  std::printf(
      "# intra-node %s %.0f GB/s x %.2f, %d NICs x %.0f Gb/s x %.2f (%s), leaves of %d nodes, algorithm %s, "
      "protocol %s\n",
      to_string(cluster.intra.topology), cluster.intra.bytes_per_s / 1e9, cluster.efficiency.intra_node,
      cluster.nic.per_node, cluster.nic.bytes_per_s * 8 / 1e9, cluster.efficiency.inter_node,
      to_string(cluster.nic.mapping), cluster.inter.leaf_size, o.algorithm ? to_string(*o.algorithm) : "auto",
      to_string(cluster.protocol));
  std::printf("%14s %12s %12s %12s %12s  %s\n", "size(B)", "time_us", "algbw_GBps", "busbw_GBps", "model_us",
              "algorithm/protocol");
  for (const Row& row : rows) {
    const double algbw = row.seconds > 0 ? row.bytes / row.seconds / 1e9 : 0;
    std::printf("%14lld %12.2f %12.2f %12.2f %12.2f  %s/%s\n", row.bytes, row.seconds * 1e6, algbw,
                algbw * bus_factor(o.kind, p), row.model_seconds * 1e6, to_string(row.algorithm),
                to_string(row.protocol));
  }
  return 0;
}

}  // namespace hzp::cli
