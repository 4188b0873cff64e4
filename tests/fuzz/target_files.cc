// Targets "checkpoint" and "trace": the two file formats the runtime reads back.
//
// checkpoint: a rank file (runtime/train/checkpoint.h) — a small valid one is built here (header + finite
// payload with its checksum), then its header JSON is mutated (JsonMutator) and/or its bytes damaged
// (flips, truncation, splices) — read with read_checkpoint against the layout that wrote it.
// trace: the shipped traces (traces/*.json), cut to their first events so a case stays small, mutated as
// JSON documents and bytes, read with trace_from_json after parse_json_strict.
// Pass: ok, or kInvalidInput with a clean message (checks.h); anything else (a crash, an escaped exception,
// kInternal, a message echoing the input) fails.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/train/checkpoint.h"
#include "shared/base/json_io.h"
#include "shared/trace/trace_format.h"
#include "tests/fuzz/checks.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/mutate.h"

namespace hzp::fuzz {
namespace {

using runtime::CheckpointHeader;
using runtime::FloatSpan;

// The layout every checkpoint case is read against: two segments.
CheckpointHeader expected_header() {
  CheckpointHeader h;
  h.rank = 1;
  h.world_size = 4;
  h.policy = "zero3";
  h.next_step = 5;
  h.adam_steps = 5;
  h.segments = {{8, 4}, {6, 3}};
  return h;
}

class CheckpointTarget : public FuzzTarget {
 public:
  std::string prepare(const Context& context) override {
    path_ = (std::filesystem::path(context.work_dir) / "rank_1.bin").string();
    std::vector<float> data(spans_floats());
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = 0.25f * static_cast<float>(i) - 1.0f;
    std::vector<FloatSpan> spans = spans_of(data.data());
    if (!runtime::write_checkpoint(path_, expected_header(), spans).ok()) return "cannot write the seed checkpoint";
    std::ifstream in(path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    seed_ = ss.str();
    const std::size_t nl = seed_.find('\n');
    header_ = nlohmann::json::parse(seed_.substr(0, nl));
    payload_ = seed_.substr(nl + 1);
    mutator_.add_seed(header_.dump());
    return "";
  }
  std::string generate(Rng& rng) override {
    std::string header = header_.dump(), payload = payload_;
    switch (rng.below(4)) {
      case 0:
        header = mutator_.generate(rng);
        break;  // a mutated header, payload intact
      case 1:
        mutator_.mutate_bytes(rng, payload);
        break;  // damaged payload
      case 2:
        header = mutator_.generate(rng);
        mutator_.mutate_bytes(rng, payload);
        break;
      default: {  // damage anywhere in the file
        std::string all = header + "\n" + payload;
        mutator_.mutate_bytes(rng, all);
        return all;
      }
    }
    return header + "\n" + payload;
  }
  Verdict run(const std::string& input) override {
    {
      std::ofstream out(path_, std::ios::binary | std::ios::trunc);
      out << input;
    }
    std::vector<float> data(spans_floats());
    auto r = runtime::read_checkpoint(path_, expected_header(), 10, spans_of(data.data()));
    if (auto stop = stop_on_error("read_checkpoint", r.status())) return *stop;
    return Verdict::pass();
  }
  const char* extension() const override { return ".bin"; }

 private:
  static std::size_t spans_floats() { return 8 + 4 + 4 + 6 + 3 + 3; }
  static std::vector<FloatSpan> spans_of(float* p) {
    return {{p, 8}, {p + 8, 4}, {p + 12, 4}, {p + 16, 6}, {p + 22, 3}, {p + 25, 3}};
  }
  std::string path_, seed_, payload_;
  nlohmann::json header_;
  JsonMutator mutator_;
};

class TraceTarget : public FuzzTarget {
 public:
  std::string prepare(const Context& context) override {
    for (const char* name : {"tiny_dense_4ranks.json", "tiny_moe_4ranks.json"}) {
      std::ifstream in(context.source_dir + "/traces/" + name);
      if (!in) return std::string("missing traces/") + name;
      nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
      if (doc.is_discarded() || !doc.contains("events")) return std::string("unreadable traces/") + name;
      auto& events = doc["events"].get_ref<nlohmann::json::array_t&>();
      if (events.size() > 40) events.resize(40);  // small cases; the rest of the document stays whole
      mutator_.add_seed(doc.dump());
    }
    return "";
  }
  std::string generate(Rng& rng) override { return mutator_.generate(rng); }
  void add_seed(const std::string& input) override { mutator_.add_seed(input); }
  Verdict run(const std::string& input) override {
    auto doc = parse_json_strict(input, kMaxTraceBytes, 8);
    if (auto stop = stop_on_error("parse_json_strict", doc.status())) return *stop;
    auto t = trace_from_json(*doc);
    if (auto stop = stop_on_error("trace_from_json", t.status())) return *stop;
    // What reads back must write out and read back the same.
    auto again = trace_from_json(trace_to_json(*t));
    if (!again.ok()) return Verdict::fail("a trace that reads does not read back: " + again.status().message());
    if (again->events.size() != t->events.size()) return Verdict::fail("events lost in a round trip");
    return Verdict::pass();
  }
  const char* extension() const override { return ".json"; }

 private:
  JsonMutator mutator_;
};

}  // namespace

std::unique_ptr<FuzzTarget> make_checkpoint_target() {
  return std::make_unique<CheckpointTarget>();
}
std::unique_ptr<FuzzTarget> make_trace_target() {
  return std::make_unique<TraceTarget>();
}

}  // namespace hzp::fuzz
