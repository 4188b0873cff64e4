// Which ranks a symmetric simulation runs (symmetry.h).
#include "sim/symmetry.h"

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

}  // namespace hzp::sim
