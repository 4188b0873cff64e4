// hzp trace format, version 1 (trace_format.h, traces/README.md).
#include "shared/trace/trace_format.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <variant>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/scenario/scenario_parser.h"

namespace hzp {
namespace {

using nlohmann::json;

constexpr std::initializer_list<TraceKind> kKinds = {
    TraceKind::kCompute,       TraceKind::kAllGather, TraceKind::kReduceScatter,
    TraceKind::kAllReduce,     TraceKind::kBroadcast, TraceKind::kAllToAll,
    TraceKind::kOptimizerStep, TraceKind::kAcquire,   TraceKind::kRelease};

bool is_collective(TraceKind k) {
  return k == TraceKind::kAllGather || k == TraceKind::kReduceScatter || k == TraceKind::kAllReduce ||
         k == TraceKind::kBroadcast || k == TraceKind::kAllToAll;
}

// Field readers of one JSON object; errors are kInvalidInput "WHERE.key: what, got VALUE".
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  Status bad(const std::string& key, const std::string& what) const {
    const json* v = find(key);
    return Status::InvalidInput(where_ + "." + key + ": " + what + (v ? ", got " + printable(v->dump(), 60) : ""));
  }
  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  Result<std::int64_t> integer(const std::string& key, std::int64_t min, std::int64_t max) const {
    const json* v = find(key);
    if (v == nullptr) return Status::InvalidInput(where_ + "." + key + ": missing");
    if (!v->is_number_integer()) return bad(key, "must be an integer");
    // nlohmann stores every non-negative integer as unsigned: both bounds apply to it too (0 against a
    // minimum of 1 was let through, and divided by).
    const bool huge = v->is_number_unsigned() &&
                      v->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (huge || v->get<std::int64_t>() < min || v->get<std::int64_t>() > max)
      return bad(key, max < min ? "names an entry of an empty table"
                                : "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    return v->get<std::int64_t>();
  }
  Result<double> number(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return Status::InvalidInput(where_ + "." + key + ": missing");
    if (!v->is_number() || !std::isfinite(v->get<double>())) return bad(key, "must be a finite number");
    return v->get<double>();
  }
  Result<std::string> string(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return Status::InvalidInput(where_ + "." + key + ": missing");
    if (!v->is_string()) return bad(key, "must be a string");
    return v->get<std::string>();
  }
  // A string that must be one of `names` (spelled as to_string spells them); returns its index.
  template <typename E>
  Result<E> name(const std::string& key, std::initializer_list<E> values) const {
    HZP_ASSIGN_OR_RETURN(std::string s, string(key));
    for (E e : values)
      if (s == to_string(e)) return e;
    std::vector<std::string> names;
    for (E e : values) names.push_back(to_string(e));
    return bad(key, "must be one of " + join(names));
  }

 private:
  const json& obj_;
  std::string where_;
};

}  // namespace

const char* to_string(TraceKind kind) {
  switch (kind) {
    case TraceKind::kCompute:
      return "compute";
    case TraceKind::kAllGather:
      return "all_gather";
    case TraceKind::kReduceScatter:
      return "reduce_scatter";
    case TraceKind::kAllReduce:
      return "all_reduce";
    case TraceKind::kBroadcast:
      return "broadcast";
    case TraceKind::kAllToAll:
      return "all_to_all";
    case TraceKind::kOptimizerStep:
      return "optimizer_step";
    case TraceKind::kAcquire:
      return "acquire";
    case TraceKind::kRelease:
      return "release";
  }
  return "?";
}

TraceKind trace_kind(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return TraceKind::kAllGather;
    case CollectiveKind::kReduceScatter:
      return TraceKind::kReduceScatter;
    case CollectiveKind::kAllReduce:
      return TraceKind::kAllReduce;
    case CollectiveKind::kBroadcast:
      return TraceKind::kBroadcast;
    case CollectiveKind::kAllToAll:
      return TraceKind::kAllToAll;
  }
  return TraceKind::kAllReduce;
}

Trace trace_header(const Scenario& scenario, const Schedule& schedule) {
  Trace t;
  t.scenario = scenario.name;
  t.scenario_config = scenario_to_json(scenario);
  t.policy = to_string(schedule.policy);
  t.world_size = schedule.world_size;
  t.gpus_per_node = schedule.gpus_per_node;
  for (StreamKind stream : schedule.streams) t.streams.emplace_back(to_string(stream));
  for (const ProcessGroup& g : schedule.groups) t.groups.push_back({to_string(g.role), g.ranks});
  for (const BufferPool& p : schedule.pools) t.pools.push_back(p.name);
  return t;
}

TraceEvent trace_event(const Schedule& schedule, int rank, int op, std::int64_t step, int stream, double start_us,
                       double end_us, std::int64_t bytes) {
  const Op& body = schedule.program_of(rank).ops[op];
  TraceEvent e;
  e.rank = rank;
  e.step = step;
  e.op = op;
  e.stream = stream;
  e.start_us = start_us;
  e.end_us = end_us;
  if (const auto* c = std::get_if<ComputeOp>(&body.body)) {
    e.kind = TraceKind::kCompute;
    e.module = c->module;
    e.phase = c->phase;
    e.layer = c->layer;
    e.micro_batch = c->micro_batch;
  } else if (const auto* c = std::get_if<CollectiveOp>(&body.body)) {
    e.kind = trace_kind(c->kind);
    e.payload = c->payload;
    e.layer = c->layer;
    e.micro_batch = c->micro_batch;
    e.bytes = bytes;
    e.group = schedule.rank_groups[rank][c->role];
  } else if (const auto* o = std::get_if<OptimizerStepOp>(&body.body)) {
    e.kind = TraceKind::kOptimizerStep;
    e.layer = o->layer;
    e.bucket = o->bucket;
  } else if (const auto* a = std::get_if<BufferAcquireOp>(&body.body)) {
    e.kind = TraceKind::kAcquire;
    e.pool = a->pool;
    e.layer = a->layer;
  } else if (const auto* r = std::get_if<BufferReleaseOp>(&body.body)) {
    e.kind = TraceKind::kRelease;
    e.pool = r->pool;
    e.layer = r->layer;
  }
  return e;
}

namespace {

json event_to_json(const Trace& t, const TraceEvent& e) {
  json j = {{"rank", e.rank},
            {"step", e.step},
            {"op", e.op},
            {"stream", t.streams[e.stream]},
            {"kind", to_string(e.kind)},
            {"start_us", e.start_us},
            {"end_us", e.end_us},
            {"layer", e.layer}};
  if (e.kind == TraceKind::kCompute) {
    j["module"] = to_string(e.module);
    j["phase"] = to_string(e.phase);
    j["micro_batch"] = e.micro_batch;
  } else if (is_collective(e.kind)) {
    j["micro_batch"] = e.micro_batch;
    j["bytes"] = e.bytes;
    j["payload"] = to_string(e.payload);
    j["group"] = e.group;
    j["role"] = t.groups[e.group].role;
  } else if (e.kind == TraceKind::kOptimizerStep) {
    j["bucket"] = e.bucket;
  } else {
    j["pool"] = t.pools[e.pool];
  }
  return j;
}

// The readers' summary `which` ("model" or "training") of the scenario as recorded (whatever its fields hold:
// null when not an integer): what a trace writes, and what one read must hold where it has the summary.
json summary_of(const json& sc, const std::string& which) {
  auto field = [&](const char* object, const char* key) -> json {
    if (!sc.is_object() || !sc.contains(object) || !sc[object].is_object() || !sc[object].contains(key)) return nullptr;
    const json& v = sc[object][key];
    return v.is_number_integer() ? v : json(nullptr);
  };
  if (which == "model") {
    const bool moe = sc.is_object() && sc.contains("model") && sc["model"].is_object() && sc["model"].contains("moe") &&
                     !sc["model"]["moe"].is_null();
    return {{"layers", field("model", "layers")}, {"hidden", field("model", "hidden")}, {"moe", moe}};
  }
  return {{"seq_len", field("training", "seq_len")},
          {"micro_batch", field("training", "micro_batch")},
          {"global_batch_sequences", field("training", "global_batch_sequences")}};
}

// The document without its events (an empty "events" array).
json header_to_json(const Trace& t) {
  json groups = json::array();
  for (std::size_t g = 0; g < t.groups.size(); ++g)
    groups.push_back({{"index", g}, {"role", t.groups[g].role}, {"ranks", t.groups[g].ranks}});
  const json model = summary_of(t.scenario_config, "model");
  const json training = summary_of(t.scenario_config, "training");
  return {{"format", kTraceFormat},
          {"version", kTraceVersion},
          {"scenario", t.scenario},
          {"scenario_config", t.scenario_config},
          {"policy", t.policy},
          {"world_size", t.world_size},
          {"gpus_per_node", t.gpus_per_node},
          {"model", model},
          {"training", training},
          {"streams", t.streams},
          {"groups", groups},
          {"pools", t.pools},
          {"events", json::array()}};
}

}  // namespace

json trace_to_json(const Trace& t) {
  json doc = header_to_json(t);
  json& events = doc["events"];
  for (const TraceEvent& e : t.events) events.push_back(event_to_json(t, e));
  return doc;
}

Result<std::string> trace_json_text(const Trace& t, std::size_t max_bytes) {
  // nlohmann orders an object's keys: "events" is the document's first, so its array opens the text.
  const std::string header = header_to_json(t).dump();
  const std::string opening = R"({"events":[],)";
  if (header.compare(0, opening.size(), opening) != 0) return Status::Internal("trace header: unexpected layout");
  std::string text = R"({"events":[)";
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    if (i > 0) text += ',';
    text += event_to_json(t, t.events[i]).dump();
    if (text.size() + 2 + header.size() - opening.size() > max_bytes)  // the whole text, were it to end here
      return Status::InvalidInput("the trace passes " +
                                  (max_bytes % (1u << 20) == 0 ? std::to_string(max_bytes >> 20) + " MiB"
                                                               : std::to_string(max_bytes) + " bytes") +
                                  ", what hzp replay reads, at event " + std::to_string(i) + " of " +
                                  std::to_string(t.events.size()) + " (step " + std::to_string(t.events[i].step) +
                                  "): profile fewer steps");
  }
  text += "],";
  text.append(header, opening.size());
  return text;
}

namespace {

// A name the trace gives (scenario, policy, stream, group role, pool) is shown in messages and reports as
// it is, so it must be plain text that printable() leaves alone (the rule of a scenario's labels): a stream
// named with terminal escapes reached the terminal raw in replay's errors.
Status check_name(const Fields& f, const std::string& key, const std::string& name) {
  if (!name.empty() && name.size() <= 128 && printable(name, 128) == name) return Status::Ok();
  const std::string rule = "must be 1 to 128 bytes of printable text";
  return f.bad(key, f.find(key) != nullptr ? rule : rule + ", got " + quoted(name, 40));
}

// The trace's header: format, version, scenario, policy, world.
Status read_trace_header(const json& doc, const Fields& top, Trace& t) {
  // Only the format's keys: a typo, or megabytes under a key nobody reads, is refused, as in a scenario.
  static const std::set<std::string> known = {"format",     "version",       "scenario", "scenario_config", "policy",
                                              "world_size", "gpus_per_node", "model",    "training",        "streams",
                                              "groups",     "pools",         "events"};
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (known.count(it.key()) == 0)
      return Status::InvalidInput("trace." + printable(it.key(), 60) + ": unknown key (the format's are " +
                                  "format, version, scenario, scenario_config, policy, world_size, gpus_per_node, "
                                  "model, training, streams, groups, pools, events)");
  HZP_ASSIGN_OR_RETURN(std::string format, top.string("format"));
  if (format != kTraceFormat) return top.bad("format", "must be \"hzp-trace\"");
  HZP_ASSIGN_OR_RETURN(std::int64_t version, top.integer("version", 0, 1 << 20));
  if (version != kTraceVersion)
    return top.bad("version", "this hzp reads version " + std::to_string(kTraceVersion) + " only");
  HZP_ASSIGN_OR_RETURN(t.scenario, top.string("scenario"));
  HZP_RETURN_IF_ERROR(check_name(top, "scenario", t.scenario));
  HZP_ASSIGN_OR_RETURN(t.policy, top.string("policy"));
  HZP_RETURN_IF_ERROR(check_name(top, "policy", t.policy));
  if (const json* sc = top.find("scenario_config"); sc == nullptr || !sc->is_object())
    return top.bad("scenario_config", "must be the resolved scenario object");
  t.scenario_config = doc["scenario_config"];
  // The readers' summaries, written from scenario_config: where present, what it gives (the eighth attack of
  // issue 35: a policy, model or training summary contradicting it was accepted, and replay printed it).
  for (const char* summary : {"model", "training"}) {
    const json* s = top.find(summary);
    if (s == nullptr) continue;
    if (!s->is_object() || s->size() > 16) return top.bad(summary, "must be a summary object");
    // Compared as written: 16.0 for an integer is not what a trace holds (the tenth attack).
    if (const json want = summary_of(t.scenario_config, summary); s->dump() != want.dump())
      return top.bad(summary, "must be what scenario_config gives, " + printable(want.dump(), 120));
  }
  if (const json& name = t.scenario_config.contains("name") ? t.scenario_config["name"] : json();
      name.is_string() && name.get<std::string>() != t.scenario)
    return top.bad("scenario", "must be scenario_config.name, " + quoted(name.get<std::string>(), 60));
  if (const json* sc_policy = t.scenario_config.contains("policy") ? &t.scenario_config["policy"] : nullptr;
      sc_policy != nullptr && sc_policy->is_object() && sc_policy->contains("preset") &&
      (*sc_policy)["preset"].is_string() && (*sc_policy)["preset"].get<std::string>() != t.policy)
    return top.bad("policy",
                   "must be scenario_config.policy.preset, " + quoted((*sc_policy)["preset"].get<std::string>(), 40));
  HZP_ASSIGN_OR_RETURN(std::int64_t world, top.integer("world_size", 1, 1 << 20));
  HZP_ASSIGN_OR_RETURN(std::int64_t per_node, top.integer("gpus_per_node", 1, world));
  if (world % per_node != 0) return top.bad("gpus_per_node", "must divide world_size (" + std::to_string(world) + ")");
  t.world_size = static_cast<int>(world);
  t.gpus_per_node = static_cast<int>(per_node);
  return Status::Ok();
}

// The streams, groups and pools the events name.
Status read_trace_tables(const Fields& top, Trace& t) {
  const std::int64_t world = t.world_size;
  const json* streams = top.find("streams");
  if (streams == nullptr || !streams->is_array() || streams->empty() || streams->size() > 64)
    return top.bad("streams", "must be an array of 1 to 64 stream names");
  for (std::size_t i = 0; i < streams->size(); ++i) {
    if (!(*streams)[i].is_string()) return top.bad("streams", "element " + std::to_string(i) + " is not a string");
    t.streams.push_back((*streams)[i].get<std::string>());
    HZP_RETURN_IF_ERROR(check_name(top, "streams[" + std::to_string(i) + "]", t.streams.back()));
    if (std::find(t.streams.begin(), t.streams.end() - 1, t.streams.back()) != t.streams.end() - 1)
      return top.bad("streams", "names " + quoted(t.streams.back(), 40) + " twice");
  }
  const json* groups = top.find("groups");
  if (groups == nullptr || !groups->is_array()) return top.bad("groups", "must be an array");
  for (std::size_t g = 0; g < groups->size(); ++g) {
    const json& gj = (*groups)[g];
    const std::string where = "trace.groups[" + std::to_string(g) + "]";
    if (!gj.is_object()) return Status::InvalidInput(where + ": must be an object");
    const Fields f(gj, where);
    HZP_ASSIGN_OR_RETURN(std::int64_t index, f.integer("index", 0, static_cast<std::int64_t>(groups->size()) - 1));
    if (index != static_cast<std::int64_t>(g))
      return f.bad("index", "must equal the group's position " + std::to_string(g));
    TraceGroup group;
    HZP_ASSIGN_OR_RETURN(group.role, f.string("role"));
    HZP_RETURN_IF_ERROR(check_name(f, "role", group.role));
    const json* ranks = f.find("ranks");
    if (ranks == nullptr || !ranks->is_array() || ranks->empty() || ranks->size() > static_cast<std::size_t>(world))
      return f.bad("ranks", "must be an array of 1 to world_size ranks");
    for (const json& r : *ranks) {
      if (!r.is_number_integer() || r.get<std::int64_t>() < 0 || r.get<std::int64_t>() >= world)
        return f.bad("ranks", "holds " + printable(r.dump(), 20) + ", not a rank of the world");
      group.ranks.push_back(r.get<int>());
    }
    t.groups.push_back(std::move(group));
  }
  if (const json* pools = top.find("pools")) {
    if (!pools->is_array() || pools->size() > 64) return top.bad("pools", "must be an array of at most 64 names");
    for (const json& p : *pools) {
      if (!p.is_string()) return top.bad("pools", "holds a non-string");
      t.pools.push_back(p.get<std::string>());
      HZP_RETURN_IF_ERROR(check_name(top, "pools[" + std::to_string(t.pools.size() - 1) + "]", t.pools.back()));
    }
  }
  return Status::Ok();
}

// Names of streams and pools as the events give them, to indices. Version 1 traces written before the
// `pools` table named pools per event: those are collected as they come.
struct EventIndex {
  std::map<std::string, int> stream, pool;
  bool pool_table = false;
};

// trace.events[i], its fields checked against the world and the tables.
Result<TraceEvent> read_trace_event(const json& ej, std::size_t i, EventIndex& index, Trace& t) {
  const std::int64_t world = t.world_size;
  const std::string where = "trace.events[" + std::to_string(i) + "]";
  if (!ej.is_object()) return Status::InvalidInput(where + ": must be an object");
  const Fields f(ej, where);
  TraceEvent e;
  HZP_ASSIGN_OR_RETURN(std::int64_t rank, f.integer("rank", 0, world - 1));
  e.rank = static_cast<int>(rank);
  HZP_ASSIGN_OR_RETURN(e.step, f.integer("step", 0, 1'000'000'000));
  HZP_ASSIGN_OR_RETURN(std::int64_t op, f.integer("op", 0, 100'000'000));
  e.op = static_cast<int>(op);
  HZP_ASSIGN_OR_RETURN(std::string stream, f.string("stream"));
  auto s = index.stream.find(stream);
  if (s == index.stream.end()) return f.bad("stream", "is not one of the trace's streams");
  e.stream = s->second;
  HZP_ASSIGN_OR_RETURN(e.kind, f.name("kind", kKinds));
  // The keys its kind carries, as trace_to_json writes them, and no others.
  static const std::set<std::string> kCommon = {"rank", "step", "op", "stream", "kind", "start_us", "end_us", "layer"};
  static const std::set<std::string> kCompute = {"module", "phase", "micro_batch"};
  static const std::set<std::string> kCollective = {"micro_batch", "bytes", "payload", "group", "role"};
  static const std::set<std::string> kOptimizer = {"bucket"}, kBuffer = {"pool"};
  const std::set<std::string>& own = e.kind == TraceKind::kCompute         ? kCompute
                                     : is_collective(e.kind)               ? kCollective
                                     : e.kind == TraceKind::kOptimizerStep ? kOptimizer
                                                                           : kBuffer;
  for (auto it = ej.begin(); it != ej.end(); ++it)
    if (!kCommon.count(it.key()) && !own.count(it.key()))
      return Status::InvalidInput(where + "." + printable(it.key(), 60) + ": not a key of " + to_string(e.kind) +
                                  " events");
  HZP_ASSIGN_OR_RETURN(e.start_us, f.number("start_us"));
  HZP_ASSIGN_OR_RETURN(e.end_us, f.number("end_us"));
  // Microseconds from the trace's first event, within a year (±1.7e308 reached the simulator as infinity).
  for (const auto& [key, value] : {std::pair{"start_us", e.start_us}, std::pair{"end_us", e.end_us}})
    if (value < 0 || value > kMaxTraceMicroseconds)
      return f.bad(key, "must be in [0, " + std::to_string(static_cast<long long>(kMaxTraceMicroseconds)) +
                            "] microseconds from the trace's start");
  if (e.end_us < e.start_us) return f.bad("end_us", "is before start_us (" + std::to_string(e.start_us) + ")");
  HZP_ASSIGN_OR_RETURN(std::int64_t layer, f.integer("layer", -1, 1 << 20));
  e.layer = static_cast<int>(layer);
  if (e.kind == TraceKind::kCompute) {
    HZP_ASSIGN_OR_RETURN(e.module, f.name("module", {ModuleKind::kEmbedding, ModuleKind::kAttention, ModuleKind::kMlp,
                                                     ModuleKind::kMoe, ModuleKind::kHead}));
    HZP_ASSIGN_OR_RETURN(e.phase, f.name("phase", {Phase::kForward, Phase::kBackward, Phase::kRecompute}));
    HZP_ASSIGN_OR_RETURN(std::int64_t mb, f.integer("micro_batch", 0, 1 << 20));
    e.micro_batch = static_cast<int>(mb);
  } else if (is_collective(e.kind)) {
    HZP_ASSIGN_OR_RETURN(std::int64_t mb, f.integer("micro_batch", 0, 1 << 20));
    e.micro_batch = static_cast<int>(mb);
    HZP_ASSIGN_OR_RETURN(e.bytes, f.integer("bytes", 0, kMaxEventBytes));
    HZP_ASSIGN_OR_RETURN(
        e.payload, f.name("payload", {Payload::kParams, Payload::kGrads, Payload::kActivations, Payload::kGradNorm}));
    HZP_ASSIGN_OR_RETURN(std::int64_t group, f.integer("group", 0, static_cast<std::int64_t>(t.groups.size()) - 1));
    e.group = static_cast<int>(group);
    const std::vector<int>& members = t.groups[e.group].ranks;
    if (std::find(members.begin(), members.end(), e.rank) == members.end())
      return f.bad("group", "names a group rank " + std::to_string(e.rank) + " is not a member of");
    if (ej.contains("role") && !(ej["role"].is_string() && ej["role"].get<std::string>() == t.groups[e.group].role))
      return f.bad("role", "must be its group's role, " + t.groups[e.group].role);
  } else if (e.kind == TraceKind::kOptimizerStep) {
    HZP_ASSIGN_OR_RETURN(std::int64_t bucket, f.integer("bucket", 0, 1 << 20));
    e.bucket = static_cast<int>(bucket);
  } else {
    HZP_ASSIGN_OR_RETURN(std::string pool, f.string("pool"));
    auto p = index.pool.find(pool);
    if (p == index.pool.end()) {
      if (index.pool_table || index.pool.size() >= 64) return f.bad("pool", "is not one of the trace's pools");
      HZP_RETURN_IF_ERROR(check_name(f, "pool", pool));
      p = index.pool.emplace(pool, static_cast<int>(t.pools.size())).first;
      t.pools.push_back(pool);
    }
    e.pool = p->second;
  }
  return e;
}

// A stream runs one op at a time: events of one (rank, stream) must not overlap (1 ns of slack for
// rounding of the microsecond timestamps).
Status check_streams_serial(const Trace& t) {
  std::vector<std::size_t> order(t.events.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const TraceEvent &x = t.events[a], &y = t.events[b];
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.stream != y.stream) return x.stream < y.stream;
    // At one start time a zero-length op comes first: [t, t] then [t, t + d] is serial, the other order not.
    return x.start_us < y.start_us || (x.start_us == y.start_us && x.end_us < y.end_us);
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const TraceEvent &prev = t.events[order[k - 1]], &cur = t.events[order[k]];
    if (prev.rank == cur.rank && prev.stream == cur.stream && cur.start_us < prev.end_us - 1e-3)
      return Status::InvalidInput("trace.events[" + std::to_string(order[k]) + "].start_us: starts at " +
                                  std::to_string(cur.start_us) + " us, before event " + std::to_string(order[k - 1]) +
                                  " on the same rank " + std::to_string(cur.rank) + " and stream " +
                                  quoted(t.streams[cur.stream], 40) + " ends (" + std::to_string(prev.end_us) +
                                  " us): a stream runs one op at a time");
  }
  return Status::Ok();
}

// The steps a trace holds run consecutively (a replay runs that many); they are renumbered from 0. A step
// renumbered to 10^9 made replay simulate a billion steps.
Status check_consecutive_steps(Trace& t) {
  if (t.events.empty()) return Status::Ok();
  std::set<std::int64_t> steps;
  for (const TraceEvent& e : t.events) steps.insert(e.step);
  const std::int64_t first = *steps.begin(), last = *steps.rbegin();
  if (static_cast<std::int64_t>(steps.size()) > kMaxTraceSteps)
    return Status::InvalidInput("trace.events: " + std::to_string(steps.size()) + " steps, more than the " +
                                std::to_string(kMaxTraceSteps) + " a trace may hold");
  if (last - first + 1 != static_cast<std::int64_t>(steps.size()))
    return Status::InvalidInput("trace.events: the steps run from " + std::to_string(first) + " to " +
                                std::to_string(last) + " with only " + std::to_string(steps.size()) +
                                " of them present: a trace's steps are consecutive");
  for (TraceEvent& e : t.events) e.step -= first;
  return Status::Ok();
}

// An op of a rank's program runs once a step: a second event of the same (rank, step, op) is a trace edited
// or merged wrong (every event renumbered into step 0 replayed as one step of doubled ops).
Status check_ops_once(const Trace& t) {
  std::vector<std::size_t> order(t.events.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto key = [&](std::size_t i) { return std::tuple(t.events[i].rank, t.events[i].step, t.events[i].op); };
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return std::pair(key(a), a) < std::pair(key(b), b); });
  for (std::size_t k = 1; k < order.size(); ++k)
    if (key(order[k - 1]) == key(order[k])) {
      const TraceEvent& e = t.events[order[k]];
      return Status::InvalidInput("trace.events[" + std::to_string(order[k]) + "]: rank " + std::to_string(e.rank) +
                                  "'s op " + std::to_string(e.op) + " of step " + std::to_string(e.step) +
                                  " again, after event " + std::to_string(order[k - 1]) + ": an op runs once a step");
    }
  return Status::Ok();
}

}  // namespace

Result<Trace> trace_from_json(const json& doc) {
  if (!doc.is_object()) return Status::InvalidInput("trace: must be a JSON object");
  const Fields top(doc, "trace");
  Trace t;
  HZP_RETURN_IF_ERROR(read_trace_header(doc, top, t));
  HZP_RETURN_IF_ERROR(read_trace_tables(top, t));
  const json* events = top.find("events");
  if (events == nullptr || !events->is_array()) return top.bad("events", "must be an array");
  if (static_cast<std::int64_t>(events->size()) > kMaxTraceEvents)
    return top.bad("events", "holds " + std::to_string(events->size()) + " events, more than the " +
                                 std::to_string(kMaxTraceEvents) + " a trace may hold");
  EventIndex index;
  for (std::size_t i = 0; i < t.streams.size(); ++i) index.stream[t.streams[i]] = static_cast<int>(i);
  index.pool_table = top.find("pools") != nullptr;
  for (std::size_t i = 0; i < t.pools.size(); ++i) index.pool[t.pools[i]] = static_cast<int>(i);
  t.events.reserve(events->size());
  for (std::size_t i = 0; i < events->size(); ++i) {
    HZP_ASSIGN_OR_RETURN(TraceEvent e, read_trace_event((*events)[i], i, index, t));
    t.events.push_back(e);
  }
  HZP_RETURN_IF_ERROR(check_consecutive_steps(t));
  HZP_RETURN_IF_ERROR(check_ops_once(t));
  HZP_RETURN_IF_ERROR(check_streams_serial(t));
  return t;
}

namespace {

// Whether `path` is a regular file starting with gzip's magic (1f 8b); read without waiting (a FIFO is not).
bool starts_with_gzip_magic(const std::string& path) {
  Result<int> fd = open_regular_file(path);
  if (!fd.ok()) return false;
  unsigned char magic[2] = {};
  const bool gzip = ::read(*fd, magic, 2) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  ::close(*fd);
  return gzip;
}

}  // namespace

Result<Trace> load_trace_file(const std::string& path) {
  // Depth 8: the format nests four levels (events -> event -> scenario_config -> model/moe).
  // One object per event and one per group (fewer groups than ranks that record events), a few for the header.
  const JsonLimits limits{kMaxTraceBytes, 8, 0, 2 * kMaxTraceEvents + 64};
  Result<json> doc = load_json_file(path, limits);
  if (!doc.ok() || !doc->is_object() || !doc->contains("format")) {
    // A PyTorch profiler trace (Chrome trace JSON: "traceEvents") is not one: say what turns it into one.
    Result<std::string> text = read_maybe_gzip_file(path, kMaxTraceBytes);
    if (text.ok() && text->find("\"traceEvents\"") != std::string::npos)
      return Status::InvalidInput(printable(path, 200) +
                                  ": a PyTorch profiler trace, not an hzp trace: make one of it with `hzp import " +
                                  printable(path, 200) + " --scenario SCENARIO.json` (traces/README.md)");
    // A gzipped hzp trace was refused as "a NUL byte": read inflated, under the same limits; one that
    // cannot be inflated within them says so (it too was "a NUL byte": the eighth attack of issue 35).
    if (!doc.ok() && starts_with_gzip_magic(path)) {
      if (!text.ok()) return text.status();
      doc = parse_json_strict(*text, limits);
      if (!doc.ok()) return Status::InvalidInput(printable(path, 200) + " (gzip): " + doc.status().message());
    }
    if (!doc.ok()) return doc.status();
  }
  Result<Trace> t = trace_from_json(*doc);
  if (!t.ok()) return Status::InvalidInput(printable(path, 200) + ": " + t.status().message());
  return t;
}

}  // namespace hzp
