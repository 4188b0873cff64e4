// `hzp collective`: one collective over a range of sizes on the simulated cluster, printed like
// nccl-tests (size, time, algorithm and bus bandwidth), with the closed form of shared/cost/collective_cost.h
// beside each simulated time.
#include "tools/cli_collective.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Engine.hpp>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/cost/collective_cost.h"
#include "shared/scenario/presets.h"
#include "shared/scenario/scenario_parser.h"
#include "sim/collective.h"
#include "sim/platform.h"
#include "tools/cli_flags.h"
#include "tools/cli_sim_budget.h"

namespace hzp::cli {

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

// The values each flag takes: the help text and the parsers both read these lists.
constexpr CollectiveKind kOps[] = {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                   CollectiveKind::kAllReduce, CollectiveKind::kAllToAll, CollectiveKind::kBroadcast};
constexpr CollectiveAlgorithm kAlgorithms[] = {CollectiveAlgorithm::kRing, CollectiveAlgorithm::kDirect,
                                               CollectiveAlgorithm::kHierarchical, CollectiveAlgorithm::kPairwise};
constexpr ProtocolChoice kProtocols[] = {ProtocolChoice::kAuto, ProtocolChoice::kLL, ProtocolChoice::kLL128,
                                         ProtocolChoice::kSimple};
// nccl-tests' -d types: the element a "count" counts.
struct DataType {
  const char* name;
  int bytes;
};
constexpr DataType kDataTypes[] = {{"float", 4}, {"half", 2},  {"bfloat16", 2}, {"double", 8},
                                   {"int8", 1},  {"int32", 4}, {"int64", 8},    {"uint8", 1}};

template <typename T, std::size_t N>
std::string names_of(const T (&values)[N], const char* separator = " | ") {
  std::vector<std::string> names;
  for (const T& v : values) {
    if constexpr (std::is_same_v<T, DataType>)
      names.emplace_back(v.name);
    else
      names.emplace_back(to_string(v));
  }
  return join(names, separator);
}

Result<CollectiveKind> parse_op(const std::string& text) {
  for (CollectiveKind k : kOps)
    if (text == to_string(k)) return k;
  return Status::InvalidInput("--op: expected " + names_of(kOps, ", ") + ", got " + quoted(text, 40));
}

// nullopt = auto.
Result<std::optional<CollectiveAlgorithm>> parse_algorithm(const std::string& text) {
  if (text == "auto") return std::optional<CollectiveAlgorithm>();
  for (CollectiveAlgorithm a : kAlgorithms)
    if (text == to_string(a)) return std::optional<CollectiveAlgorithm>(a);
  return Status::InvalidInput("--algorithm: expected auto, " + names_of(kAlgorithms, ", ") + ", got " +
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

// Every flag once: the parser's declarations, the usage line and the option lines of the help come from here.
struct OptionSpec {
  std::string name;     // "--op"
  std::string metavar;  // "OP"; empty: a switch
  bool required = false;
  std::string help;  // may hold '\n' for continuation lines
};

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> specs = {
      {"--cluster", "PRESET|FILE.json", true,
       "a cluster preset (" + join(cluster_preset_names()) +
           ") or a JSON file holding a cluster object (format: scenarios/README.md)"},
      {"--op", "OP", true, names_of(kOps)},
      {"--group", "GROUP", true,
       "node: the GPUs of node 0; all: every GPU; N: the first N GPUs (whole nodes when N exceeds the GPUs of one "
       "node)"},
      {"--bytes", "MIN[:MAX]", true,
       "sizes in bytes, 1 to 1T; suffixes K, M, G, T = 2^10, 2^20, 2^30, 2^40 (e.g. 1K:1G)"},
      {"--nodes", "N", false,
       "nodes of the cluster; default: the cluster file's, else just enough for the group (all: 2). At most 65536 "
       "GPUs"},
      {"--algorithm", "ALGO", false,
       "auto (default: NCCL-like selection per size) | " + names_of(kAlgorithms) +
           "; a forced algorithm must apply to the group"},
      {"--protocol", "PROTO", false,
       names_of(kProtocols) +
           " as NCCL_PROTO (ring and hierarchical; direct and pairwise use simple); default: the "
           "cluster file's, else " +
           to_string(ClusterSpec{}.protocol) + " (scenarios/README.md says why not auto)"},
      {"--dtype", "TYPE", false, names_of(kDataTypes) + " (default float): the element of the count column"},
      {"--csv", "FILE", false, "also write the table as CSV (nccl-tests' columns, then hzp's)"},
      {"--json", "FILE", false, "also write the table as JSON: {cluster, op, group, rows: [...], avg_busbw_GBps}"},
      {"--max-sim-seconds", "S", false,
       "refuse, before it starts, a simulation estimated to run longer (default 600; 0: no limit; sim/README.md, "
       "\"What a simulation costs\")"},
      {"--max-sim-GiB", "G", false,
       "refuse a simulation estimated to take more memory (default: 3/4 of this machine's memory or its limits)"},
  };
  return specs;
}

std::vector<Flag> flag_table() {
  std::vector<Flag> flags;
  for (const OptionSpec& o : option_specs()) flags.push_back({o.name.c_str(), !o.metavar.empty()});
  return flags;
}

std::string help_text() {
  std::string usage = "usage: hzp collective";
  std::string column = usage;
  for (const OptionSpec& o : option_specs()) {
    const std::string item = o.required ? o.name + " " + o.metavar : "[" + o.name + " " + o.metavar + "]";
    if (column.size() + item.size() + 1 > 110) {
      usage += "\n" + std::string(22, ' ');
      column = std::string(22, ' ');
    }
    usage += " " + item;
    column += " " + item;
  }
  std::string out =
      usage + "\n\n" +
      "Simulates one collective on the SimGrid model of a cluster for sizes MIN, 2·MIN, 4·MIN, ... <= MAX "
      "and\nprints nccl-tests' table: size (B), count (elements of --dtype), type, redop, root, time "
      "(us),\nalgbw (GB/s: size / time), busbw (algbw x the nccl-tests factor: all_reduce 2(p-1)/p, "
      "all_gather,\nreduce_scatter, all_to_all (p-1)/p, broadcast 1), then hzp's model_us (the closed "
      "form of\nshared/cost/collective_cost.h) and the algorithm/protocol used, and nccl-tests' footer, "
      "the average\nbus bandwidth. Sizes follow nccl-tests: all_gather output, reduce_scatter input, "
      "all_reduce /\nbroadcast buffer, all_to_all send buffer.\n\n";
  for (const OptionSpec& o : option_specs()) {
    std::string head = "  " + o.name + " " + o.metavar;
    head.resize(std::max<std::size_t>(head.size() + 1, 30), ' ');
    // Wrap the help at 110 columns under the 30-column head.
    std::string line = head;
    for (std::size_t begin = 0; begin < o.help.size();) {
      std::size_t end = o.help.find(' ', begin);
      if (end == std::string::npos) end = o.help.size();
      const std::string word = o.help.substr(begin, end - begin);
      if (line.size() + word.size() > 110 && line.size() > 30) {
        line.pop_back();  // the space after the last word
        out += line + "\n";
        line = std::string(30, ' ');
      }
      line += word + " ";
      begin = end + 1;
    }
    line.pop_back();
    out += line + "\n";
  }
  return out + "\nExit codes: 0 ok, 2 bad arguments or cluster, 1 internal error.\n";
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
  DataType dtype = kDataTypes[0];
  std::optional<std::string> csv, json;
  sim::SimBudget budget;
};

Result<Options> parse_options(const std::vector<std::string>& args) {
  HZP_ASSIGN_OR_RETURN(ParsedArgs a, parse_flags(args, flag_table(), 0));
  for (const OptionSpec& spec : option_specs())
    if (spec.required && !a.has(spec.name)) return Status::InvalidInput("missing " + spec.name);
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
    for (ProtocolChoice p : kProtocols)
      if (*v == to_string(p)) o.protocol = p;
    if (!o.protocol)
      return Status::InvalidInput("--protocol: expected " + names_of(kProtocols, ", ") + ", got " + quoted(*v, 40));
  }
  if (auto v = a.get("--dtype")) {
    const auto* found =
        std::find_if(std::begin(kDataTypes), std::end(kDataTypes), [&](const DataType& t) { return *v == t.name; });
    if (found == std::end(kDataTypes))
      return Status::InvalidInput("--dtype: expected " + names_of(kDataTypes, ", ") + ", got " + quoted(*v, 40));
    o.dtype = *found;
  }
  for (long long size : {o.min_bytes, o.max_bytes})  // nccl-tests counts whole elements
    if (size % o.dtype.bytes != 0)
      return Status::InvalidInput("--bytes: " + std::to_string(size) + " bytes is not a whole number of " +
                                  o.dtype.name + " elements (" + std::to_string(o.dtype.bytes) + " bytes each)");
  o.csv = a.get("--csv");
  o.json = a.get("--json");
  HZP_ASSIGN_OR_RETURN(o.budget, read_sim_budget([&](const char* flag) { return a.get(flag); }));
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

const char* collective_help() {
  static const std::string text = help_text();
  return text.c_str();
}

int run_collective_command(const std::vector<std::string>& args) {
  auto options = parse_options(args);
  if (!options.ok()) return usage_error(options.status().message());
  const Options& o = *options;
  std::vector<NamedPath> outputs;
  for (const auto& [flag, path] : {std::pair{"--csv", o.csv}, std::pair{"--json", o.json}})
    if (path) outputs.push_back({flag, *path});
  if (Status st = check_output_files(outputs, {{"--cluster", o.cluster}}); !st.ok()) return fail(st);
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

  // One SimGrid engine per process: every size runs in one simulation, one after the other, on the
  // simulation's own stack (sim/platform.h).
  Status simulated = Status::Ok();
  sim::SimCost cost;
  double wall_s = 0;
  const Status started = sim::run_on_simulation_stack([&] {
    int argc = 2;
    char arg0[] = "hzp";
    char arg1[] = "--log=root.thresh:warning";
    char* argv[] = {arg0, arg1, nullptr};
    sg4::Engine engine(&argc, argv);
    sim::configure_engine(engine);
    sim::add_platform_estimate(cost, cluster);
    sim::estimate_cost(cost);
    simulated = sim::check_budget(cost, o.budget);
    if (!simulated.ok()) return;
    // A pairwise all-to-all has at least one flow per ordered pair of its nodes, all in flight at once
    // (sim/collectives/pairwise.cc): known before the platform is built and its flows dry-run (which took
    // 16 s and 420 MB to refuse one over 8192 nodes).
    if (std::any_of(rows.begin(), rows.end(),
                    [](const Row& row) { return row.algorithm == CollectiveAlgorithm::kPairwise; })) {
      sim::SimCost pairs = cost;
      const double flows = static_cast<double>(shape.nodes) * (shape.nodes - 1);
      pairs.collectives = 1;
      pairs.flows = pairs.peak_flows = flows;
      pairs.pair_work = flows * flows;
      pairs.flows_at_least = true;
      sim::estimate_cost(pairs);
      simulated = sim::check_budget(pairs, o.budget);
      if (!simulated.ok()) return;
    }
    sim::SimBudget after_build = o.budget;
    if (cost.seconds > o.budget.warn_seconds) after_build.warn_seconds = 1e300;  // said once already
    sim::announce_platform_build(cost);
    auto platform = sim::build_platform(engine, cluster);
    if (!platform.ok()) {
      simulated = platform.status();
      return;
    }
    // Its cost first (sim/cost.h): a dry run of each size's flows, which depend on its algorithm only (a dry run
    // of an all-to-all over 8192 nodes takes ~15 s: once, not once per size; and the dry run
    // of an algorithm's largest size: a smaller one may leave flows of less than a byte out).
    std::map<int, sim::FlowTally> by_algorithm;
    for (auto r = rows.rbegin(); r != rows.rend(); ++r) {
      const Row& row = *r;
      auto [it, fresh] = by_algorithm.try_emplace(static_cast<int>(row.algorithm));
      if (fresh)
        sim::run_collective(
            *platform, {o.kind, static_cast<double>(row.bytes), &group, row.algorithm, row.protocol, -1, &it->second});
      const sim::FlowTally& tally = it->second;
      cost.collectives += 1;
      cost.flows += tally.flows;
      cost.peak_flows = std::max(cost.peak_flows, tally.peak);
      cost.pair_work += tally.pair_work;
      cost.ecmp_pair_work += tally.ecmp_pair_work;
    }
    cost.actors = 1;
    cost.hosts = static_cast<double>(engine.get_host_count());
    cost.links = static_cast<double>(engine.get_link_count());
    sim::estimate_cost(cost);
    simulated = sim::check_budget(cost, after_build);
    if (!simulated.ok()) return;
    sg4::Actor::create("collective", platform->gpus[group.ranks.front()], [&] {
      for (Row& row : rows) {
        const double start = sg4::Engine::get_clock();
        sim::run_collective(*platform, {o.kind, static_cast<double>(row.bytes), &group, row.algorithm, row.protocol});
        row.seconds = sg4::Engine::get_clock() - start;
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    engine.run();
    wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  if (!started.ok()) return fail(started);
  if (!simulated.ok()) return fail(simulated);

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
  // nccl-tests' columns (one in-place-style set: the simulation has no out-of-place difference), then hzp's.
  const bool reduces = o.kind == CollectiveKind::kAllReduce || o.kind == CollectiveKind::kReduceScatter;
  const char* redop = reduces ? "sum" : "none";
  const int root = o.kind == CollectiveKind::kBroadcast ? 0 : -1;
  std::printf("%14s %14s %9s %6s %5s %12s %10s %10s %12s  %s\n", "size(B)", "count", "type", "redop", "root",
              "time(us)", "algbw", "busbw", "model(us)", "algorithm/protocol");
  std::string csv = "size_bytes,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,model_us,algorithm,protocol\n";
  nlohmann::json json_rows = nlohmann::json::array();
  double busbw_sum = 0;
  for (const Row& row : rows) {
    const double algbw = row.seconds > 0 ? row.bytes / row.seconds / 1e9 : 0;
    const double busbw = algbw * bus_factor(o.kind, p);
    const long long count = row.bytes / o.dtype.bytes;
    busbw_sum += busbw;
    char line[256];
    std::printf("%14lld %14lld %9s %6s %5d %12.2f %10.2f %10.2f %12.2f  %s/%s\n", row.bytes, count, o.dtype.name, redop,
                root, row.seconds * 1e6, algbw, busbw, row.model_seconds * 1e6, to_string(row.algorithm),
                to_string(row.protocol));
    std::snprintf(line, sizeof line, "%lld,%lld,%s,%s,%d,%.6g,%.6g,%.6g,%.6g,%s,%s\n", row.bytes, count, o.dtype.name,
                  redop, root, row.seconds * 1e6, algbw, busbw, row.model_seconds * 1e6, to_string(row.algorithm),
                  to_string(row.protocol));
    csv += line;
    json_rows.push_back({{"size_bytes", row.bytes},
                         {"count", count},
                         {"type", o.dtype.name},
                         {"redop", redop},
                         {"root", root},
                         {"time_us", row.seconds * 1e6},
                         {"algbw_GBps", algbw},
                         {"busbw_GBps", busbw},
                         {"model_us", row.model_seconds * 1e6},
                         {"algorithm", to_string(row.algorithm)},
                         {"protocol", to_string(row.protocol)}});
  }
  const double avg_busbw = busbw_sum / static_cast<double>(rows.size());
  std::printf("# Out of bounds values : 0 OK (simulated)\n# Avg bus bandwidth    : %g\n", avg_busbw);
  std::printf("# Simulation           : %.2f s wall (estimated %.2f s, %.2f GiB; %.0f flows, up to %.0f at once)\n",
              wall_s, cost.seconds, cost.resident_bytes / (1024.0 * 1024 * 1024), cost.flows, cost.peak_flows);
  if (o.csv) {
    if (Status st = write_file_atomic(*o.csv, csv); !st.ok()) return fail(st);
  }
  if (o.json) {
    const nlohmann::json doc = {{"cluster", cluster.name},    {"gpu", cluster.gpu.type},
                                {"nodes", cluster.nodes},     {"gpus_per_node", cluster.gpus_per_node},
                                {"op", to_string(o.kind)},    {"group_gpus", p},
                                {"group_nodes", shape.nodes}, {"rows", json_rows},
                                {"avg_busbw_GBps", avg_busbw}};
    if (Status st = write_file_atomic(*o.json, doc.dump(2) + "\n"); !st.ok()) return fail(st);
  }
  return 0;
}

}  // namespace hzp::cli
