// The trace format in the core (shared/trace/trace_format.h): the shipped traces read back; every kind of bad
// trace is refused with the event index and field; size is bounded before anything is decoded.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "shared/base/json_io.h"
#include "shared/trace/perfetto.h"
#include "shared/trace/trace_format.h"

namespace {

using nlohmann::json;

json shipped(const std::string& name) {
  std::ifstream in(std::string(HZP_SOURCE_DIR) + "/traces/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::string error_of(const json& doc) {
  auto t = hzp::trace_from_json(doc);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == hzp::StatusCode::kInvalidInput);
  CHECK(t.status().message().size() < 600);
  return t.status().message();
}

}  // namespace

TEST_CASE("trace format: the shipped traces read back and write out the same events", "[trace]") {
  for (const char* name : {"tiny_dense_4ranks.json", "tiny_moe_4ranks.json"}) {
    INFO(name);
    auto t = hzp::load_trace_file(std::string(HZP_SOURCE_DIR) + "/traces/" + name);
    INFO(t.status().message());
    REQUIRE(t.ok());
    CHECK(t->world_size == 4);
    CHECK(!t->events.empty());
    auto again = hzp::trace_from_json(hzp::trace_to_json(*t));
    REQUIRE(again.ok());
    CHECK(again->events.size() == t->events.size());
    // The text made one event at a time is the tree's text, byte for byte.
    auto text = hzp::trace_json_text(*t);
    REQUIRE(text.ok());
    CHECK(*text == hzp::trace_to_json(*t).dump());
  }
}

TEST_CASE("trace format: a trace's text stops at its byte limit, naming the event and step", "[trace][errors]") {
  auto t = hzp::load_trace_file(std::string(HZP_SOURCE_DIR) + "/traces/tiny_dense_4ranks.json");
  REQUIRE(t.ok());
  const std::size_t bytes = hzp::trace_to_json(*t).dump().size();
  CHECK(hzp::trace_json_text(*t, bytes).ok());
  auto cut = hzp::trace_json_text(*t, bytes - 1);
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.status().code() == hzp::StatusCode::kInvalidInput);
  CHECK_THAT(cut.status().message(),
             Catch::Contains("what hzp replay reads, at event " + std::to_string(t->events.size() - 1) + " of " +
                             std::to_string(t->events.size())));
  CHECK_THAT(hzp::trace_json_text(*t, 1000).status().message(), Catch::Contains("at event 0 of"));
}

TEST_CASE("trace format: bad traces name the event and the field", "[trace][errors]") {
  const json good = shipped("tiny_dense_4ranks.json");
  json t = good;
  t["version"] = 2;
  CHECK_THAT(error_of(t), Catch::Contains("trace.version: this hzp reads version 1 only"));
  t = good;
  t["x"] = json::object();
  CHECK_THAT(error_of(t), Catch::Contains("trace.x: unknown key"));
  t = good;
  t.erase("events");
  CHECK_THAT(error_of(t), Catch::Contains("trace.events: must be an array"));
  t = good;
  t["events"][7]["kind"] = "teleport";
  CHECK_THAT(error_of(t), Catch::Contains("trace.events[7].kind: must be one of compute"));
  t = good;
  t["events"][3]["stream"] = "warp";
  CHECK_THAT(error_of(t), Catch::Contains("trace.events[3].stream: is not one of the trace's streams"));
  // Names are shown as they are in messages: control characters in one are refused, not echoed raw.
  t = good;
  t["streams"][0] = "comp\x1b[2Jute";
  CHECK_THAT(error_of(t),
             Catch::Contains("trace.streams[0]: must be 1 to 128 bytes of printable text, got \"comp\\x1b[2Jute\""));
  t = good;
  t["groups"][0]["role"] = "dp\n";
  CHECK_THAT(error_of(t), Catch::Contains("trace.groups[0].role: must be 1 to 128 bytes of printable text"));
  t = good;
  t["pools"][0] = "";
  CHECK_THAT(error_of(t), Catch::Contains("trace.pools[0]: must be 1 to 128 bytes of printable text"));
  t = good;
  t["scenario"] = "tiny\r";
  CHECK_THAT(error_of(t), Catch::Contains("trace.scenario: must be 1 to 128 bytes of printable text"));
  t = good;
  t["events"][5]["rank"] = 9;
  CHECK_THAT(error_of(t), Catch::Contains("trace.events[5].rank: must be in [0, 3]"));
  t = good;
  t["events"][5]["end_us"] = -1;
  CHECK_THAT(error_of(t), Catch::Contains("trace.events[5].end_us: must be in [0, "));
  t = good;
  t["events"][5]["end_us"] = t["events"][5]["start_us"].get<double>() - 1;
  CHECK_THAT(error_of(t), Catch::Contains("trace.events[5].end_us: is before start_us"));
  t = good;
  t["events"][5]["start_us"] = "soon";
  CHECK_THAT(error_of(t), Catch::Contains("trace.events[5].start_us: must be a finite number"));
  // Two ops on one stream of one rank at the same time: a stream runs one op at a time.
  t = good;
  json copy = t["events"][10];
  copy["op"] = copy["op"].get<int>() + 1000;
  copy["start_us"] =
      copy["start_us"].get<double>() + 0.25 * (copy["end_us"].get<double>() - copy["start_us"].get<double>());
  t["events"].push_back(copy);
  CHECK_THAT(error_of(t), Catch::Contains("a stream runs one op at a time"));
  // A zero-length op that starts where a longer one starts is serial (it comes first), in any file order.
  t = good;
  {
    json first = t["events"][10];
    json zero = first;
    zero["op"] = first["op"].get<int>() + 1000;
    zero["end_us"] = zero["start_us"];
    t["events"].push_back(zero);
    CHECK(hzp::trace_from_json(t).ok());
  }
  // Every event renumbered into step 0: each op twice in one step (was replayed as one step of doubled ops).
  t = good;
  for (json& e : t["events"]) e["step"] = 0;
  CHECK_THAT(error_of(t), Catch::Contains("again, after event") && Catch::Contains("an op runs once a step"));
  // A collective in a group its rank is not a member of.
  t = good;
  for (json& e : t["events"])
    if (e.contains("group")) {
      const int rank = e["rank"].get<int>();
      for (std::size_t g = 0; g < t["groups"].size(); ++g) {
        bool member = false;
        for (const json& r : t["groups"][g]["ranks"]) member = member || r.get<int>() == rank;
        if (!member) {
          e["group"] = g;
          break;
        }
      }
      break;
    }
  CHECK_THAT(error_of(t), Catch::Contains("is not a member of"));
  // Too many events is refused before any is read.
  t = good;
  t["events"] = json::array();
  t["events"].get_ref<json::array_t&>().resize(hzp::kMaxTraceEvents + 1);
  CHECK_THAT(error_of(t), Catch::Contains("more than the 2000000 a trace may hold"));
  CHECK_THAT(hzp::load_trace_file(std::string(HZP_SOURCE_DIR) + "/traces").status().message(),
             Catch::Contains("not a regular file"));
}

// A document of many tiny values takes far more memory decoded than its size: "{}" is 3 bytes of text and
// 96 of heap. The pre-scan counts what the tree will take, exactly for such shapes, and refuses past the
// limit before the parser allocates anything.
TEST_CASE("json reading: the decoded tree's size is estimated and bounded before parsing", "[trace][errors]") {
  std::string objects = "[";
  for (int i = 0; i < 1000; ++i) objects += i ? ",{}" : "{}";
  objects += "]";
  // root 16 + array 32 + 1000 x (element 32 + empty object 64)
  CHECK(hzp::json_tree_bytes(objects) == 16 + 32 + 1000 * (32 + 64));
  // an object member is a 96-byte map node; keys and string values past 15 characters own their text
  CHECK(hzp::json_tree_bytes(R"({"a":1,"b":"short","long_key_of_20_chars":"a value of twenty chars"})") ==
        16 + 64 + 3 * 96 + 48 + 48 + (20 + 17) + (23 + 17));
  // quotes and brackets inside strings are text, not structure
  CHECK(hzp::json_tree_bytes(R"(["[{\"}]"])") == 16 + 32 + 32 + 48);

  const auto refused = hzp::parse_json_strict(objects, hzp::JsonLimits{1 << 20, 8, 50'000});
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(),
             Catch::Contains("decoding this document would take about") && Catch::Contains("refused before parsing"));
  CHECK(hzp::parse_json_strict(objects, hzp::JsonLimits{1 << 20, 8, 200'000}).ok());
  // a count of objects (a trace's events) is refused the same way; "{" inside strings is not one
  const auto many = hzp::parse_json_strict(objects, hzp::JsonLimits{1 << 20, 8, 0, 999});
  REQUIRE_FALSE(many.ok());
  CHECK_THAT(many.status().message(), Catch::Contains("1000 JSON objects, more than the 999 accepted"));
  CHECK(hzp::parse_json_strict(R"([{"a":"{{{{"}])", hzp::JsonLimits{1 << 20, 8, 0, 1}).ok());
  // a NUL byte after the document (nlohmann would stop reading there) or inside it is refused
  for (const std::string& nul : {std::string("{\"a\":1}\0garbage", 15), std::string("{\"a\":\0 1}", 9)}) {
    const auto r = hzp::parse_json_strict(nul, 1 << 20);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("a NUL byte"));
  }
  // by default a document may decode into twelve times its byte limit
  std::string zeros = "[0";
  for (int i = 0; i < 5000; ++i) zeros += ",0";
  zeros += "]";
  CHECK_FALSE(hzp::parse_json_strict(zeros, 10'000).ok());  // 160 kB of tree > 120 kB
  CHECK(hzp::parse_json_strict(zeros, 20'000).ok());        // < 240 kB
}

TEST_CASE("perfetto: spans written as text read back as nlohmann::json writes them", "[trace]") {
  // The timeline writer builds its JSON text directly (no document per span); nlohmann::json is the reference.
  const std::string odd = std::string("a\"b\\c\nd\te\x01f\x1f") + "\xc3\xa9 L3";
  hzp::PerfettoTimeline t;
  t.process(0, odd);
  t.thread(0, 1, "compute");
  hzp::SpanArgs args;
  args.add("step", 3LL).add("bytes", 123456789012LL).add("flops", 1.5e12).add("tiny", 1e-300).add("third", 1.0 / 3);
  args.add("nan", std::nan("")).add("role", odd.c_str());
  t.span(0, 1, odd, "comm", 0.1 + 0.2, 1e-7, args);
  t.span(0, 1, "empty args", "compute", 5, 6, hzp::SpanArgs{});
  t.span(0, 1, "json args", "compute", 5, 6, json{{"k", odd}});
  const json doc = json::parse(std::move(t).to_text({{"scenario", odd}}));
  const json& events = doc["traceEvents"];
  REQUIRE(events.size() == 6);
  CHECK(events[0]["args"]["name"] == odd);
  const json& span = events[3];
  CHECK(span["name"] == odd);
  CHECK(span["cat"] == "comm");
  CHECK(span["ph"] == "X");
  CHECK(span["ts"].get<double>() == 0.1 + 0.2);  // shortest text that reads back the same double
  CHECK(span["dur"].get<double>() == 1e-7);
  CHECK(span["args"]["step"] == 3);
  CHECK(span["args"]["bytes"] == 123456789012LL);
  CHECK(span["args"]["flops"].get<double>() == 1.5e12);
  CHECK(span["args"]["tiny"].get<double>() == 1e-300);
  CHECK(span["args"]["third"].get<double>() == 1.0 / 3);
  CHECK(span["args"]["nan"].is_null());
  CHECK(span["args"]["role"] == odd);
  CHECK(events[4]["args"] == json::object());
  CHECK(events[5]["args"]["k"] == odd);
  CHECK(doc["displayTimeUnit"] == "ms");
  CHECK(doc["otherData"]["scenario"] == odd);
}
