// The registry of fuzz targets: one explicit table, no static self-registration. `hzp_fuzz --target all`
// runs them in this order.
//
// Adding a target: write target_<name>.cc with a FuzzTarget subclass and a make_<name>_target() factory,
// declare the factory in fuzz_target.h, add the file to tests/CMakeLists.txt (hzp_fuzz) and a row here.
#include "tests/fuzz/fuzz_target.h"

#include "tests/fuzz/sandbox.h"

namespace hzp::fuzz {

std::string FuzzTarget::describe(const std::string& input) const {
  return printable(input, 160) + " (" + std::to_string(input.size()) + " bytes)";
}

const std::vector<TargetEntry>& target_registry() {
  static const std::vector<TargetEntry> table = {
      {"scenario",
       "scenario JSON mutations through parse_scenario_text, resolve and compile, "
       "estimate, plan_presets and the resolved form",
       make_scenario_target},
      {"scenario_doc",
       "the same documents through parse_json_strict and parse_scenario (the path of hzp collective --cluster "
       "and hzp train), up to the resolved form",
       make_scenario_doc_target},
      {"cli", "the hzp binary with mutated flags and values (validate, plan, schedule, simulate, collective, train)",
       make_cli_target},
      {"store", "raw TCP bytes against a loopback StoreServer (handshake, SET, GET, lying lengths)", make_store_target},
      {"checkpoint", "a rank checkpoint file with its header mutated and its bytes damaged, through read_checkpoint",
       make_checkpoint_target},
      {"trace", "the shipped traces mutated as documents and bytes, through parse_json_strict and trace_from_json",
       make_trace_target},
      {"kineto",
       "PyTorch profiler traces (cut shipped profiles) mutated, through read_kineto and kineto_to_trace; what import "
       "makes must read back",
       make_kineto_target},
      {"checkpoint_dir",
       "a checkpoint directory's structure damaged (latest, step folders, rank files, .lock: missing, truncated, "
       "links, FIFOs), through hzp train --resume and a fresh run into it",
       make_checkpoint_dir_target},
  };
  return table;
}

}  // namespace hzp::fuzz
