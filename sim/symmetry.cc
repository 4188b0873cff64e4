// Which ranks a symmetric simulation runs (symmetry.h).
#include "sim/symmetry.h"

#include <algorithm>
#include <map>
#include <utility>

namespace hzp::sim {

SymmetryPlan plan_symmetry(const Schedule& schedule) {
  SymmetryPlan plan;
  const int world = schedule.world_size;
  plan.ranks_of_program.assign(schedule.programs.size(), 0);
  std::vector<int> first(schedule.programs.size(), -1);
  plan.rep_of.resize(world);
  for (int r = 0; r < world; ++r) {
    const int p = schedule.rank_program[r];
    if (first[p] < 0) first[p] = r;
    plan.rep_of[r] = first[p];
    ++plan.ranks_of_program[p];
  }
  // Each group's role (the role index through which its members reach it).
  std::vector<int> role_of(schedule.groups.size(), -1);
  for (int r = 0; r < world; ++r)
    for (std::size_t role = 0; role < schedule.roles.size(); ++role)
      if (const int g = schedule.rank_groups[r][role]; g >= 0) role_of[g] = static_cast<int>(role);
  // Class key: role, then the (program, count) multiset of the members.
  std::map<std::pair<int, std::vector<std::pair<int, int>>>, int> class_of_key;
  std::map<std::pair<int, int>, int> class_of_role_program;  // (role, program) -> the one class holding it
  plan.group_class.assign(schedule.groups.size(), -1);
  for (std::size_t g = 0; g < schedule.groups.size(); ++g) {
    const ProcessGroup& group = schedule.groups[g];
    if (group.ranks.size() <= 1 || role_of[g] < 0) continue;
    std::map<int, int> programs;
    for (int r : group.ranks) ++programs[schedule.rank_program[r]];
    auto key = std::make_pair(role_of[g], std::vector<std::pair<int, int>>(programs.begin(), programs.end()));
    auto [it, added] = class_of_key.emplace(std::move(key), static_cast<int>(plan.class_groups.size()));
    if (added) {
      plan.class_groups.emplace_back();
      plan.class_arrivals.push_back(static_cast<int>(programs.size()));
    }
    const int cls = it->second;
    plan.group_class[g] = cls;
    plan.class_groups[cls].push_back(static_cast<int>(g));
    for (const auto& [program, count] : programs) {
      auto [held, fresh] = class_of_role_program.emplace(std::make_pair(role_of[g], program), cls);
      if (!fresh && held->second != cls) {
        plan.why_not = "the ranks of one program are in groups of different shapes on one role";
        return plan;
      }
    }
  }
  // Every class's programs arrive through their representatives: each must be in a group of the class.
  for (const auto& [role_program, cls] : class_of_role_program) {
    const int g = schedule.rank_groups[first[role_program.second]][role_program.first];
    if (g < 0 || plan.group_class[g] != cls) {
      plan.why_not = "a program's first rank is not in the groups its other ranks use";
      return plan;
    }
  }
  plan.enabled = true;
  return plan;
}

namespace {

// The ports a group's flows may use, as ids: GPU r's NVLink port is r (used when the group has another
// member on its node), NIC k of node n is world + n·NICs + k (used when the group spans nodes: the member's
// rail NICs, every NIC of the node when NICs are shared). A flow that bundles every rail of a node comes from
// members on every rail, so all of the node's NICs are listed then too.
std::vector<int> group_ports(const Schedule& schedule, const Platform& platform, const ProcessGroup& group) {
  const ClusterSpec& c = *platform.cluster;
  std::map<int, int> members_on;
  for (int r : group.ranks) ++members_on[platform.node_of(r)];
  std::vector<int> ports;
  for (int r : group.ranks) {
    const int node = platform.node_of(r);
    if (members_on[node] > 1) ports.push_back(r);
    if (members_on.size() == 1) continue;
    const int nic0 = schedule.world_size + node * c.nic.per_node;
    if (c.nic.mapping == NicMapping::kShared)
      for (int k = 0; k < c.nic.per_node; ++k) ports.push_back(nic0 + k);
    else
      for (int i = 0; i < platform.nics_per_gpu(); ++i) ports.push_back(nic0 + platform.nic_index(r) + i);
  }
  return ports;
}

// What sets a group's traffic apart from another's of its class: its members per node, node by node, and the
// rails they use.
std::vector<int> group_layout(const Platform& platform, const ProcessGroup& group) {
  std::map<int, std::vector<int>> rails_on;
  for (int r : group.ranks) rails_on[platform.node_of(r)].push_back(platform.nic_index(r));
  std::vector<int> layout;
  for (auto& [node, rails] : rails_on) {
    std::sort(rails.begin(), rails.end());
    layout.push_back(static_cast<int>(rails.size()));
    layout.insert(layout.end(), rails.begin(), rails.end());
  }
  return layout;
}

}  // namespace

void choose_simulated_groups(const Schedule& schedule, const Platform& platform, SymmetryPlan& plan) {
  const ClusterSpec& c = *platform.cluster;
  const bool shared_uplinks = c.leaves() > 1 && c.inter.oversubscription > 1;
  std::vector<char> rep_port(
      static_cast<std::size_t>(schedule.world_size) + static_cast<std::size_t>(c.nodes) * c.nic.per_node, 0);
  auto holds_rep = [&](const ProcessGroup& group) {
    return std::any_of(group.ranks.begin(), group.ranks.end(), [&](int r) { return plan.rep_of[r] == r; });
  };
  for (const std::vector<int>& groups : plan.class_groups)
    for (int g : groups)
      if (holds_rep(schedule.groups[g]))
        for (int port : group_ports(schedule, platform, schedule.groups[g])) rep_port[port] = 1;
  plan.simulated.assign(plan.class_groups.size(), {});
  for (std::size_t cls = 0; cls < plan.class_groups.size(); ++cls) {
    std::vector<std::pair<int, int>>& runs = plan.simulated[cls];
    std::vector<int> left_out;
    for (int g : plan.class_groups[cls]) {
      const ProcessGroup& group = schedule.groups[g];
      const std::vector<int> ports = group_ports(schedule, platform, group);
      if (holds_rep(group) || (shared_uplinks && !group.intra_node) ||
          std::any_of(ports.begin(), ports.end(), [&](int port) { return rep_port[port] != 0; }))
        runs.push_back({g, 1});
      else
        left_out.push_back(g);
    }
    // A left-out group is counted by a running group of its layout; one with no such group runs after all.
    std::map<std::vector<int>, std::size_t> run_of_layout;
    for (std::size_t i = 0; i < runs.size(); ++i)
      run_of_layout.emplace(group_layout(platform, schedule.groups[runs[i].first]), i);
    for (int g : left_out) {
      auto [it, fresh] = run_of_layout.emplace(group_layout(platform, schedule.groups[g]), runs.size());
      if (fresh)
        runs.push_back({g, 1});
      else
        ++runs[it->second].second;
    }
  }
}

}  // namespace hzp::sim
