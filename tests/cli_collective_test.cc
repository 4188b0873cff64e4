// `hzp collective` end to end: the table it prints (simulated time = closed form on an idle cluster) and
// its exit codes on bad arguments.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Output {
  int code = -1;
  std::string text;  // stdout and stderr together
};

Output hzp_collective(const std::string& args) {
  const std::string cmd = std::string("'") + HZP_BINARY + "' collective " + args + " 2>&1";
  Output out;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.text.append(buffer, n);
  const int status = pclose(pipe);
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

}  // namespace

TEST_CASE("hzp collective prints one row per size and the simulation agrees with the closed form", "[cli][sim]") {
  const Output r = hzp_collective("--cluster dgx-a100 --op all_reduce --group all --bytes 1M:8M");
  INFO(r.text);
  REQUIRE(r.code == 0);
  std::istringstream lines(r.text);
  std::string line;
  int rows = 0;
  long long expected_size = 1 << 20;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#' || line.find("size(B)") != std::string::npos) continue;
    std::istringstream fields(line);
    long long size = 0, count = 0;
    int root = 0;
    double time_us = 0, algbw = 0, busbw = 0, model_us = 0;
    std::string type, redop, algorithm;
    REQUIRE(fields >> size >> count >> type >> redop >> root >> time_us >> algbw >> busbw >> model_us >> algorithm);
    CHECK(size == expected_size);
    CHECK(count == size / 4);  // nccl-tests' default type, float
    CHECK(type == "float");
    CHECK(redop == "sum");
    CHECK(root == -1);
    CHECK(time_us == Approx(model_us).epsilon(1e-3));           // printed with 2 decimals
    CHECK(busbw == Approx(algbw * 2 * 15 / 16).epsilon(1e-2));  // nccl-tests all-reduce factor, p = 16
    expected_size *= 2;
    ++rows;
  }
  CHECK(rows == 4);
}

TEST_CASE("hzp collective refuses bad arguments with exit code 2", "[cli]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--op all_reduce --group node --bytes 1M", "missing --cluster"},
      {"--cluster dgx-a100 --op allreduce --group node --bytes 1M", "--op"},
      {"--cluster nope --op all_reduce --group node --bytes 1M", "cluster.preset"},
      {"--cluster dgx-a100 --op all_reduce --group 12 --bytes 1M", "whole nodes"},
      {"--cluster dgx-a100 --op all_reduce --group node --bytes 1X", "--bytes"},
      {"--cluster dgx-a100 --op all_reduce --group node --bytes 8M:1M", "below MIN"},
      {"--cluster dgx-a100 --op all_reduce --group 16 --nodes 1 --bytes 1M", "--nodes"},
      {"--cluster dgx-a100 --op all_gather --group node --bytes 1M --algorithm direct", "does not apply"},
      {"--cluster dgx-a100 --op all_gather --group node --bytes 1M --colour red", "unknown option --colour"},
      {"--cluster dgx-a100 --op all_gather --group node --bytes 1M --protocol ll256", "--protocol"},
      // LL's one-node cap is per GPU generation: an uncalibrated GPU without cluster.gpu.arch cannot run it.
      {"--cluster '" HZP_TEST_DATA_DIR "/clusters/uncalibrated_gpu.json' --op all_gather --group node --bytes 1M "
       "--protocol ll",
       "cluster.gpu.arch: must be given"},
  };
  for (const auto& [args, needle] : cases) {
    const Output r = hzp_collective(args);
    INFO(args << "\n" << r.text);
    CHECK(r.code == 2);
    CHECK(r.text.find(needle) != std::string::npos);
  }
}

TEST_CASE("hzp collective --protocol forces NCCL's protocol and prints it", "[cli]") {
  const Output simple = hzp_collective("--cluster dgx-h100 --op all_gather --group all --nodes 4 --bytes 64M");
  const Output ll128 =
      hzp_collective("--cluster dgx-h100 --op all_gather --group all --nodes 4 --bytes 64M --protocol ll128");
  INFO(simple.text << ll128.text);
  REQUIRE(simple.code == 0);
  REQUIRE(ll128.code == 0);
  CHECK(simple.text.find("ring/simple") != std::string::npos);  // the default protocol
  CHECK(ll128.text.find("ring/ll128") != std::string::npos);
  CHECK(ll128.text.find("protocol ll128") != std::string::npos);
  // Without --protocol LL is never considered, so the uncalibrated GPU needs no arch.
  const Output custom = hzp_collective("--cluster '" HZP_TEST_DATA_DIR
                                       "/clusters/uncalibrated_gpu.json' --op all_gather --group node --bytes 1M");
  INFO(custom.text);
  CHECK(custom.code == 0);
  CHECK(custom.text.find("/simple") != std::string::npos);
}

TEST_CASE("hzp collective under ECMP: scattered nodes collide, the closed form gives the average over hashes",
          "[cli][sim][ecmp]") {
  // 128 nodes of 4 x 100 Gb NICs under 4 leaves of 32, nodes scattered: a ring all-reduce crosses a leaf on
  // ~3/4 of its hops and its flows share uplinks. Each seed is one hash; the closed form (model_us) is the
  // expected slowdown, so the mean over seeds must come near it, and every seed is slower than balanced.
  auto time_of = [](const std::string& inter_node) {
    const std::string file =
        std::filesystem::temp_directory_path() / ("hzp_cli_collective_ecmp_" + std::to_string(::getpid()) + ".json");
    std::ofstream(file) << R"({"preset": "dgx-a100", "nodes": 128, "nic": {"per_node": 4, "bandwidth_Gbps": 100},
                             "inter_node": )" +
                               inter_node + "}";
    const Output r = hzp_collective("--cluster '" + file + "' --op all_reduce --group all --bytes 1G --algorithm ring");
    std::filesystem::remove(file);
    INFO(r.text);
    REQUIRE(r.code == 0);
    std::istringstream lines(r.text);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      long long size = 0, count = 0;
      int root = 0;
      std::string type, redop;
      double time_us = 0, algbw = 0, busbw = 0, model_us = 0;
      if (fields >> size >> count >> type >> redop >> root >> time_us >> algbw >> busbw >> model_us)
        return std::pair{time_us, model_us};
    }
    FAIL("no result row");
    return std::pair{0.0, 0.0};
  };
  const double balanced = time_of(R"({"leaf_size": 32})").first;
  double sum = 0, model = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    const auto [time_us, model_us] = time_of(
        R"({"leaf_size": 32, "routing": "ecmp", "placement": "scattered", "seed": )" + std::to_string(seed) + "}");
    CHECK(time_us > 1.5 * balanced);
    sum += time_us;
    model = model_us;
  }
  CHECK(sum / 6 == Approx(model).epsilon(0.10));
}

TEST_CASE("hzp collective writes nccl-tests' columns as CSV and JSON, and its help lists what it accepts",
          "[cli][sim]") {
  const auto dir = std::filesystem::temp_directory_path() / ("hzp_cli_collective_out_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string csv = (dir / "t.csv").string(), json = (dir / "t.json").string();
  const Output r =
      hzp_collective("--cluster dgx-h100 --op all_gather --group node --bytes 1K:4K --dtype bfloat16 --csv '" + csv +
                     "' --json '" + json + "'");
  INFO(r.text);
  REQUIRE(r.code == 0);
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  REQUIRE(doc["rows"].size() == 3);
  double sum = 0;
  for (const auto& row : doc["rows"]) {
    CHECK(row["count"] == row["size_bytes"].get<long long>() / 2);
    CHECK(row["type"] == "bfloat16");
    CHECK(row["redop"] == "none");
    CHECK(row["busbw_GBps"].get<double>() == Approx(row["algbw_GBps"].get<double>() * 7 / 8));  // (p-1)/p, p = 8
    sum += row["busbw_GBps"].get<double>();
  }
  CHECK(doc["avg_busbw_GBps"].get<double>() == Approx(sum / 3));
  // The footer, as nccl-tests prints it.
  char avg[64];
  std::snprintf(avg, sizeof avg, "# Avg bus bandwidth    : %g", doc["avg_busbw_GBps"].get<double>());
  CHECK(r.text.find(avg) != std::string::npos);
  std::ifstream csv_in(csv);
  std::string header, first;
  std::getline(csv_in, header);
  std::getline(csv_in, first);
  CHECK(header == "size_bytes,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,model_us,algorithm,protocol");
  CHECK(first.rfind("1024,512,bfloat16,none,-1,", 0) == 0);
  // The help comes from the parser's table: every preset, the real protocol default, every option.
  const Output help = hzp_collective("--help");
  for (const char* text : {"dgx-h200", "dgx-b200", "else simple", "--dtype TYPE", "--csv FILE", "--json FILE"})
    CHECK(help.text.find(text) != std::string::npos);
  CHECK(hzp_collective("--cluster dgx-h100 --op all_gather --group node --bytes 1K --dtype fp7").code == 2);
  // nccl-tests counts whole elements: 3 bytes of double is not a size.
  const Output part = hzp_collective("--cluster dgx-h100 --op all_reduce --group node --bytes 3 --dtype double");
  CHECK(part.code == 2);
  CHECK(part.text.find("not a whole number of double elements") != std::string::npos);
  std::filesystem::remove_all(dir);
}
