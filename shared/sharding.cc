// Process groups of the sharding plan and the per-GPU memory model (see sharding.h for the layout).
#include "shared/sharding.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

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
}

}  // namespace

Result<ShardingLayout> build_sharding_layout(const ClusterSpec& cluster, const ShardingSpec& s,
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

  const int ep = options.expert_parallel;
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
  for (int dense = 0; dense < kNumDenseRoles; ++dense) {
    const GroupRole role = static_cast<GroupRole>(static_cast<int>(GroupRole::kExpertParamShard) + dense);
    const int dense_index = layout.role(static_cast<GroupRole>(dense));
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

MemoryBreakdown memory_per_gpu(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule) {
  (void)scenario;
  MemoryBreakdown m;
  m.params = schedule.state_bytes.params;
  m.grads = schedule.state_bytes.grads;
  m.optimizer = schedule.state_bytes.optimizer;
  m.activations = cost.activation_bytes + cost.transient_bytes;
  for (const BufferPool& pool : schedule.pools) m.buffers += static_cast<double>(pool.slots) * pool.slot_bytes;
  return m;
}

}  // namespace hzp
