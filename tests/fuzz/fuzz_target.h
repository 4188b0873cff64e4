// What a fuzz target is: where its seeds come from, how it turns a seed into a case, and how one case is
// judged. The harness (fuzz_main.cc) runs every case in a forked, resource-limited child (sandbox.h), so a
// target's run() may crash, hang or exhaust memory: that is what the harness reports.
//
// A case is a byte string whose meaning is the target's: a scenario document, an encoded argv (case_file.h),
// a stream of store connections. The harness only stores, saves and replays those bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/rng.h"

namespace hzp::fuzz {

// Fixed for the whole run; built by the harness before any target is made.
struct Context {
  std::string source_dir;  // the repository (compile-time HZP_SOURCE_DIR): seeds are found relative to it
  std::string hzp_binary;  // the built `hzp` (compile-time HZP_BINARY), for targets that spawn it
  std::string work_dir;    // a fresh temporary directory the harness removes at the end
  double case_timeout_s = 10;
};

// The judgement of one case, made in the child. `passed` false carries what was wrong in `reason`, one line.
struct Verdict {
  bool passed = true;
  std::string reason;
  static Verdict pass() { return {}; }
  static Verdict fail(std::string why) { return {false, std::move(why)}; }
};

class FuzzTarget {
 public:
  virtual ~FuzzTarget() = default;
  // Loads seeds and prepares fixtures (in the parent, once); an empty string means ready, else why not.
  virtual std::string prepare(const Context& context) = 0;
  // Case `rng` stands for: a mutation of the seeds. Must depend on nothing but `rng` and the seeds.
  virtual std::string generate(Rng& rng) = 0;
  // Runs one case (in the sandboxed child) and judges it.
  virtual Verdict run(const std::string& input) = 0;
  // File name extension of saved reproducers, with the dot (".json", ".argv", ".bin").
  virtual const char* extension() const = 0;
  // One line for reports: what the case is (an argv, the start of a document).
  virtual std::string describe(const std::string& input) const;
  // Extra seeds from --corpus or the regression folder (text of the file); targets may ignore them.
  virtual void add_seed(const std::string& input) { (void)input; }
};

// One row of the registry table (targets.cc).
struct TargetEntry {
  const char* name;
  const char* description;
  std::unique_ptr<FuzzTarget> (*make)();
};

const std::vector<TargetEntry>& target_registry();

// The factories, one per file target_<name>.cc.
std::unique_ptr<FuzzTarget> make_scenario_target();
std::unique_ptr<FuzzTarget> make_scenario_doc_target();
std::unique_ptr<FuzzTarget> make_cli_target();
std::unique_ptr<FuzzTarget> make_store_target();
std::unique_ptr<FuzzTarget> make_checkpoint_target();  // target_files.cc
std::unique_ptr<FuzzTarget> make_trace_target();       // target_files.cc
std::unique_ptr<FuzzTarget> make_kineto_target();
std::unique_ptr<FuzzTarget> make_checkpoint_dir_target();

}  // namespace hzp::fuzz
