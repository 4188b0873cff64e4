// Process groups of the sharding plan and the per-GPU memory model (see sharding.h for the layout).
#include "shared/schedule/sharding.h"

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

#include "shared/scenario/presets.h"

namespace hzp {

std::string sharding_notation(const ShardingSpec& s) {
  auto g = [](const char* name, ShardGroup x) {
    return std::string(name) + "[" + std::to_string(x.s0) + "," + std::to_string(x.s1) + "]";
  };
  return g("P", s.params) + " " + g("G", s.grads) + " " + g("OS", s.optimizer);
}

namespace {

// Coordinates of a rank relative to a (s0, s1) sharding block.
struct BlockCoords {
  int block = 0;     // which block (node-block major, then local block)
  int position = 0;  // shard index inside the block, node-major
};

BlockCoords coords(int rank, int gpus_per_node, ShardGroup g) {
  const int node = rank / gpus_per_node, local = rank % gpus_per_node;
  const int local_blocks = gpus_per_node / g.s0;
  return {(node / g.s1) * local_blocks + local / g.s0, (node % g.s1) * g.s0 + local % g.s0};
}

bool divides(ShardGroup small, ShardGroup big) {
  return big.s0 % small.s0 == 0 && big.s1 % small.s1 == 0;
}

// Where a group's members sit: nodes spanned, members on the first member's node, whether all on one.
void place_group(ProcessGroup& group, int gpus_per_node) {
  const int first_node = group.ranks.front() / gpus_per_node;
  int nodes = 0, last_node = -1, on_first = 0;
  std::vector<int> sorted_nodes;
  for (int r : group.ranks) sorted_nodes.push_back(r / gpus_per_node);
  std::sort(sorted_nodes.begin(), sorted_nodes.end());
  for (int n : sorted_nodes) {
    if (n != last_node) ++nodes;
    last_node = n;
    if (n == first_node) ++on_first;
  }
  group.nodes = nodes;
  group.intra_node = nodes == 1;
  group.ranks_per_node = on_first;
}

// Group ranks by key (first appearance order); members in rank order, then optionally re-sorted.
void add_role(ShardingLayout& layout, GroupRole role, int world, int gpus_per_node,
              const std::function<long long(int)>& key_of, const std::function<long long(int)>& order_of) {
  const int role_index = static_cast<int>(layout.roles.size());
  layout.roles.push_back(role);
  layout.index[static_cast<int>(role)] = role_index;
  for (std::vector<int>& groups_of_rank : layout.rank_groups) groups_of_rank.push_back(-1);
  std::unordered_map<long long, int> index_of_key;
  const int first_group = static_cast<int>(layout.groups.size());
  for (int r = 0; r < world; ++r) {
    const long long key = key_of(r);
    auto [it, inserted] = index_of_key.try_emplace(key, static_cast<int>(layout.groups.size()));
    if (inserted) layout.groups.push_back(ProcessGroup{role, {}, false, 0, 0});
    layout.groups[it->second].ranks.push_back(r);
    layout.rank_groups[r][role_index] = it->second;
  }
  for (int g = first_group; g < static_cast<int>(layout.groups.size()); ++g) {
    ProcessGroup& group = layout.groups[g];
    std::stable_sort(group.ranks.begin(), group.ranks.end(), [&](int a, int b) { return order_of(a) < order_of(b); });
    place_group(group, gpus_per_node);
  }
}

// A role whose groups are given as member lists; ranks in none of them get a group of their own.
void add_groups(ShardingLayout& out, GroupRole role, const std::vector<std::vector<int>>& groups, int gpus_per_node) {
  const int index = static_cast<int>(out.roles.size());
  out.index[static_cast<int>(role)] = index;
  out.roles.push_back(role);
  for (std::vector<int>& g : out.rank_groups) g.push_back(-1);
  for (const std::vector<int>& members : groups) {
    ProcessGroup group{role, members, false, 0, 0};
    place_group(group, gpus_per_node);
    for (int r : members) out.rank_groups[r][index] = static_cast<int>(out.groups.size());
    out.groups.push_back(std::move(group));
  }
  for (int r = 0; r < static_cast<int>(out.rank_groups.size()); ++r)
    if (out.rank_groups[r][index] < 0) {
      ProcessGroup alone{role, {r}, true, 1, 1};
      out.rank_groups[r][index] = static_cast<int>(out.groups.size());
      out.groups.push_back(std::move(alone));
    }
}

// The pipeline's links: s -> s+1 (and, interleaved, p-1 -> 0) of every (tensor, data) coordinate, per
// direction and colour; with tied embeddings, the first and the last stage of each coordinate.
void add_pipeline_roles(ShardingLayout& out, const ParallelMesh& mesh, bool wrap, bool tied_embeddings,
                        int gpus_per_node) {
  const int t = mesh.tensor, p = mesh.pipeline;
  const GroupRole act[3] = {GroupRole::kPipeActEven, GroupRole::kPipeActOdd, GroupRole::kPipeActWrap};
  const GroupRole grad[3] = {GroupRole::kPipeGradEven, GroupRole::kPipeGradOdd, GroupRole::kPipeGradWrap};
  const int colours = wrap ? 3 : std::min(2, p - 1);
  for (int colour = 0; colour < colours; ++colour)
    for (int direction = 0; direction < 2; ++direction) {
      std::vector<std::vector<int>> links;
      for (int stage = 0; stage < p; ++stage) {
        const bool last = stage == p - 1;
        if ((last && !wrap) || pipe_link_colour(stage, p) != colour) continue;
        for (int d = 0; d < mesh.context * mesh.data; ++d)
          for (int tensor = 0; tensor < t; ++tensor) {
            const int from = mesh.global_rank(tensor, d, stage);
            const int to = mesh.global_rank(tensor, d, last ? 0 : stage + 1);
            links.push_back(direction == 0 ? std::vector<int>{from, to} : std::vector<int>{to, from});
          }
      }
      add_groups(out, direction == 0 ? act[colour] : grad[colour], links, gpus_per_node);
    }
  if (tied_embeddings) {
    std::vector<std::vector<int>> pairs;
    for (int d = 0; d < mesh.context * mesh.data; ++d)
      for (int tensor = 0; tensor < t; ++tensor)
        pairs.push_back({mesh.global_rank(tensor, d, 0), mesh.global_rank(tensor, d, p - 1)});
    add_groups(out, GroupRole::kEmbedding, pairs, gpus_per_node);
  }
}

// The replica-axis layout of `data` (one tensor x pipeline coordinate's ranks, numbered 0..C·D-1) copied to
// every coordinate, and the tensor, context and pipeline roles added (sharding.h: ND parallelism).
ShardingLayout nd_layout(const ShardingLayout& data, const ClusterSpec& cluster, const ParallelMesh& mesh, bool wrap,
                         bool tied_embeddings) {
  const int world = static_cast<int>(mesh.world()), t = mesh.tensor, p = mesh.pipeline;
  ShardingLayout out;
  out.index.fill(-1);
  out.rank_groups.assign(world, {});
  for (std::size_t role = 0; role < data.roles.size(); ++role) {
    out.index[static_cast<int>(data.roles[role])] = static_cast<int>(out.roles.size());
    out.roles.push_back(data.roles[role]);
    for (std::vector<int>& g : out.rank_groups) g.push_back(-1);
    for (int stage = 0; stage < p; ++stage)
      for (int tensor = 0; tensor < t; ++tensor)
        for (std::size_t g = 0; g < data.groups.size(); ++g) {
          if (data.groups[g].role != data.roles[role]) continue;
          ProcessGroup group{data.roles[role], {}, false, 0, 0};
          for (int d : data.groups[g].ranks) group.ranks.push_back(mesh.global_rank(tensor, d, stage));
          place_group(group, cluster.gpus_per_node);
          for (int r : group.ranks) out.rank_groups[r][role] = static_cast<int>(out.groups.size());
          out.groups.push_back(std::move(group));
        }
  }
  if (t > 1) {
    std::vector<std::vector<int>> tensor_groups;
    for (int first = 0; first < world; first += t) {
      tensor_groups.emplace_back();
      for (int i = 0; i < t; ++i) tensor_groups.back().push_back(first + i);
    }
    add_groups(out, GroupRole::kTensor, tensor_groups, cluster.gpus_per_node);
  }
  if (mesh.context > 1) {
    std::vector<std::vector<int>> context_groups;
    for (int stage = 0; stage < p; ++stage)
      for (int first = 0; first < mesh.context * mesh.data; first += mesh.context)
        for (int tensor = 0; tensor < t; ++tensor) {
          context_groups.emplace_back();
          for (int c = 0; c < mesh.context; ++c)
            context_groups.back().push_back(mesh.global_rank(tensor, first + c, stage));
        }
    add_groups(out, GroupRole::kContext, context_groups, cluster.gpus_per_node);
  }
  if (p > 1) add_pipeline_roles(out, mesh, wrap, tied_embeddings, cluster.gpus_per_node);
  return out;
}

// The layout of data parallelism alone (every rank a data-parallel rank).
Result<ShardingLayout> data_layout(const ClusterSpec& cluster, int ep, const ShardingSpec& s,
                                   const LayoutOptions& options) {
  const int R = cluster.gpus_per_node, N = cluster.nodes, world = cluster.world_size();
  for (ShardGroup g : {s.params, s.grads, s.optimizer}) {
    if (g.s0 < 1 || g.s1 < 1 || R % g.s0 != 0 || N % g.s1 != 0)
      return Status::InvalidInput("policy.sharding: group [" + std::to_string(g.s0) + ", " + std::to_string(g.s1) +
                                  "] does not tile " + std::to_string(R) + " GPUs per node x " + std::to_string(N) +
                                  " nodes");
  }
  if (!divides(s.params, s.grads) || !divides(s.grads, s.optimizer))
    return Status::InvalidInput(
        "policy.sharding: groups must nest (params divides grads divides optimizer, "
        "component-wise)");
  if (!(s.grads == s.params || s.grads == s.optimizer))
    return Status::InvalidInput("policy.sharding.grads: must be sharded like params or like optimizer");

  if (ep < 1 || world % ep != 0)
    return Status::InvalidInput("policy.expert_parallel: " + std::to_string(ep) + " does not divide " +
                                std::to_string(world) + " GPUs");
  ShardingLayout layout;
  layout.index.fill(-1);
  layout.rank_groups.assign(world, {});

  auto block = [&](ShardGroup g) { return [=](int r) -> long long { return coords(r, R, g).block; }; };
  auto position = [&](ShardGroup g) { return [=](int r) -> long long { return coords(r, R, g).position; }; };
  auto rank_order = [](int r) -> long long { return r; };

  add_role(layout, GroupRole::kParamShard, world, R, block(s.params), rank_order);
  if (s.grads == s.params) {
    add_role(layout, GroupRole::kGradShard, world, R, block(s.grads), rank_order);
  } else {
    // s_g == s_os: order the block by (param position, rank) so the reduce-scatter output is the
    // optimizer slice param_position * q + refresh_index (see sharding.h).
    auto p = position(s.params);
    add_role(layout, GroupRole::kGradShard, world, R, block(s.grads),
             [=](int r) -> long long { return p(r) * static_cast<long long>(world) + r; });
  }
  auto os_block = block(s.optimizer);
  auto p = position(s.params);
  add_role(
      layout, GroupRole::kParamRefresh, world, R,
      [=](int r) -> long long { return os_block(r) * static_cast<long long>(world) + p(r); }, rank_order);
  add_role(layout, GroupRole::kOsReplica, world, R, position(s.optimizer), rank_order);
  if (options.secondary_param_copy) add_role(layout, GroupRole::kParamSecondary, world, R, block({R, 1}), rank_order);
  if (ep == 1) return layout;

  add_role(
      layout, GroupRole::kExpertParallel, world, R, [=](int r) -> long long { return r / ep; }, rank_order);
  // Expert roles: the dense role's group of r, restricted to the ranks holding r's experts (same r % ep).
  constexpr std::pair<GroupRole, GroupRole> kExpertRoles[] = {
      {GroupRole::kParamShard, GroupRole::kExpertParamShard},
      {GroupRole::kGradShard, GroupRole::kExpertGradShard},
      {GroupRole::kParamRefresh, GroupRole::kExpertParamRefresh},
      {GroupRole::kOsReplica, GroupRole::kExpertOsReplica}};
  for (const auto& [dense, role] : kExpertRoles) {
    const int dense_index = layout.role(dense);
    std::vector<int> dense_of(world);
    for (int r = 0; r < world; ++r) dense_of[r] = layout.rank_groups[r][dense_index];
    std::vector<long long> order(world);  // keep the dense group's ring order
    for (const ProcessGroup& g : layout.groups)
      if (g.role == layout.roles[dense_index])
        for (size_t i = 0; i < g.ranks.size(); ++i) order[g.ranks[i]] = static_cast<long long>(i);
    add_role(
        layout, role, world, R, [&](int r) -> long long { return static_cast<long long>(dense_of[r]) * ep + r % ep; },
        [&](int r) -> long long { return order[r]; });
    const int index = layout.role(role);
    const size_t size = layout.groups[layout.rank_groups[0][index]].ranks.size();
    for (int r = 0; r < world; ++r)
      if (layout.groups[layout.rank_groups[r][index]].ranks.size() != size)
        return Status::InvalidInput("policy.expert_parallel: " + std::to_string(ep) + " splits the " +
                                    to_string(layout.roles[dense_index]) +
                                    " groups unevenly; expert_parallel and each group's "
                                    "s0 must divide one another");
  }
  return layout;
}

}  // namespace

Result<ShardingLayout> build_sharding_layout(const ClusterSpec& cluster, const ParallelMesh& mesh,
                                             const ShardingSpec& sharding, const LayoutOptions& options) {
  if (mesh.tensor == 1 && mesh.pipeline == 1 && mesh.context == 1)
    return data_layout(cluster, mesh.expert, sharding, options);
  ClusterSpec replica_cluster = cluster;
  replica_cluster.gpus_per_node = mesh.replica.ranks_per_node;
  replica_cluster.nodes = mesh.replica.nodes;
  HZP_ASSIGN_OR_RETURN(const ShardingLayout data, data_layout(replica_cluster, mesh.expert, sharding, options));
  if (mesh.replica.size() != mesh.context * mesh.data)
    return Status::InvalidInput("policy.parallel.context: " + std::to_string(mesh.context) + " does not divide the " +
                                std::to_string(mesh.replica.size()) + " replica-axis ranks");
  return nd_layout(data, cluster, mesh, options.interleaved, options.tied_embeddings);
}

StateBytes state_bytes_per_param(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
    case Precision::kFp16:
      return {2, 2, 12};  // fp32 master + Adam m + v
    case Precision::kFp32:
      return {4, 4, 8};  // the parameter is the master; Adam m + v
  }
  return {};
}

StateBytes state_bytes_per_param(Precision precision, bool grads_in_fp32) {
  StateBytes bytes = state_bytes_per_param(precision);
  if (grads_in_fp32) bytes.grad = 4;
  return bytes;
}

MemoryBreakdown memory_of_program(const ModelCost& cost, const Schedule& schedule, int program) {
  MemoryBreakdown m;
  const StateBytesPerRank& states = schedule.state_bytes[program];
  m.params = states.params;
  m.grads = states.grads;
  m.optimizer = states.optimizer;
  // Saved activations live from a module's forward to its backward: their peak over the program's order
  // (one micro-batch without pipelining; the pipeline schedule's micro-batches in flight with it).
  std::vector<double> saved(static_cast<std::size_t>(schedule.units.size()) * 2, 0.0);
  const int layers = static_cast<int>(schedule.units.size()) - 2;
  for (const ModuleCost& mc : cost.modules)
    saved[static_cast<std::size_t>(unit_of_module(mc, layers)) * 2 + module_slot(mc.kind)] += mc.activation_bytes;
  double live = 0, peak = 0;
  for (const Op& op : schedule.programs[program].ops)
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      const double a = saved[static_cast<std::size_t>(c->unit) * 2 + module_slot(c->module)];
      if (c->phase == Phase::kForward) live += a;
      if (c->phase == Phase::kBackward) live -= a;
      peak = std::max(peak, live);
    }
  m.activations = peak + cost.transient_bytes;
  for (const BufferPool& pool : schedule.pools) m.buffers += static_cast<double>(pool.slots) * pool.slot_bytes;
  return m;
}

MemoryBreakdown memory_per_gpu(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule) {
  (void)scenario;
  MemoryBreakdown worst;
  for (std::size_t p = 0; p < schedule.programs.size(); ++p) {
    const MemoryBreakdown m = memory_of_program(cost, schedule, static_cast<int>(p));
    if (p == 0 || m.total() > worst.total()) worst = m;
  }
  return worst;
}

}  // namespace hzp
