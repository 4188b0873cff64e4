// attention_bench: the speed of a backend's causal attention kernels (runtime/device/kernels.h), forward and
// backward, in TFLOP/s, at the shapes of issue 31 / 32 (sequence 1 k .. 32 k, head dimension 64 and 128).
//
//   build/attention_bench [--backend cpu|cuda] [--type bf16|fp16|fp32] [--seqs 1024,4096,...] [--dims 64,128]
//                         [--heads H] [--tokens T] [--iters N] [--pasa]
//
// Each shape runs batch = max(1, T / seq) sequences (default T 16384) of H heads (default 16, as many kv heads),
// random inputs; after one warm-up call, N calls of each pass (default 5) are timed with the stream
// synchronised around them. FLOPs follow flash attention's convention: forward 4 * batch * heads * seq^2 *
// d / 2 (causal), backward 2.5x the forward. One JSON line per shape on stdout: the backend, its description,
// which kernel ran (HZP_CUDA_ATTENTION=simple or wmma forces the CUDA backend's simple or WMMA kernels), milliseconds
// and TFLOP/s of each pass. Exit 2 on a bad argument, 1 when the backend cannot run a shape (the message names it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/device/kernels.h"
#include "runtime/device/numeric.h"
#include "runtime/device/registry.h"

namespace {

using namespace hzp::runtime;
using hzp::AttentionAlgorithm;
using hzp::Result;
using hzp::Status;

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "attention_bench: %s\n", message.c_str());
  std::exit(2);
}

std::vector<std::int64_t> parse_list(const std::string& flag, const char* text, std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> out;
  std::string s = text;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < lo || v > hi)
      usage_error(flag + ": '" + item + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                  "]");
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void run_error(const std::string& what, const Status& s) {
  std::fprintf(stderr, "attention_bench: %s: %s\n", what.c_str(), s.message().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "cuda", type_name = "bf16";
  std::vector<std::int64_t> seqs = {1024, 2048, 4096, 8192, 16384, 32768}, dims = {64, 128};
  std::int64_t heads = 16, tokens = 16384, iters = 5;
  bool pasa = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--backend") {
      backend = value();
    } else if (a == "--type") {
      type_name = value();
    } else if (a == "--seqs") {
      seqs = parse_list(a, value(), 1, 1 << 20);
    } else if (a == "--dims") {
      dims = parse_list(a, value(), 1, 1024);
    } else if (a == "--heads") {
      heads = parse_list(a, value(), 1, 1024).at(0);
    } else if (a == "--tokens") {
      tokens = parse_list(a, value(), 1, std::int64_t{1} << 24).at(0);
    } else if (a == "--iters") {
      iters = parse_list(a, value(), 1, 1000).at(0);
    } else if (a == "--pasa") {
      pasa = true;
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: attention_bench [--backend cpu|cuda] [--type bf16|fp16|fp32] [--seqs N,...] [--dims D,...]\n"
          "                       [--heads H] [--tokens T] [--iters N] [--pasa]\n");
      return 0;
    } else {
      usage_error("unknown argument '" + a + "' (see --help)");
    }
  }
  ScalarType type;
  if (type_name == "bf16")
    type = ScalarType::kBf16;
  else if (type_name == "fp16")
    type = ScalarType::kFp16;
  else if (type_name == "fp32")
    type = ScalarType::kFp32;
  else
    usage_error("--type: '" + type_name + "' is not bf16, fp16 or fp32");

  const char* forced = std::getenv("HZP_CUDA_ATTENTION");
  const std::string choice = forced != nullptr ? forced : "";
  if (!choice.empty() && choice != "simple" && choice != "wmma")
    usage_error("HZP_CUDA_ATTENTION: '" + choice + "' is not simple or wmma (unset: the default kernels)");
  if (std::none_of(backends().begin(), backends().end(), [&](const BackendEntry& b) { return backend == b.name; }))
    usage_error("--backend: '" + backend + "' is not a backend of this build");
  Result<std::unique_ptr<Device>> made = make_device(backend, BackendOptions{});
  if (!made.ok()) run_error("backend " + backend, made.status());
  std::unique_ptr<Device> device = std::move(made).value();
  const std::string kernel = backend == "cuda" ? (choice.empty() ? "default" : choice) : backend;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::int64_t seq : seqs) {
    for (std::int64_t d : dims) {
      const std::int64_t batch = std::max<std::int64_t>(1, tokens / seq);
      AttentionShape shape{batch, seq, heads, heads, d};
      if (pasa) shape.algorithm = AttentionAlgorithm::kPasa;
      const std::int64_t n = batch * seq * heads * d, stats = batch * heads * seq;
      const std::int64_t elem = static_cast<std::int64_t>(scalar_bytes(type));
      std::unique_ptr<Stream> stream = device->create_stream("bench");
      std::unique_ptr<Kernels> k = device->create_kernels(*stream);
      const std::int64_t reserve_count = k->attention_reserve(shape);
      const std::int64_t bytes = 8 * n * elem + 2 * stats * 4 + reserve_count * 4 + (std::int64_t{16} << 20);
      std::unique_ptr<MemoryPool> pool = device->create_pool(bytes);
      const std::string what = "seq " + std::to_string(seq) + ", head_dim " + std::to_string(d);
      if (pool == nullptr)
        run_error(what, Status::Internal("cannot make a pool of " + std::to_string(bytes) + " bytes"));
      auto alloc = [&](std::int64_t count, ScalarType t) {
        Result<Buffer> b = pool->allocate("bench", count, t);
        if (!b.ok()) run_error(what, b.status());
        return *b;
      };
      const Buffer q = alloc(n, type), kk = alloc(n, type), v = alloc(n, type), out = alloc(n, type),
                   dout = alloc(n, type), dq = alloc(n, type), dk = alloc(n, type), dv = alloc(n, type),
                   lse = alloc(stats, ScalarType::kFp32),
                   reserve = reserve_count > 0 ? alloc(reserve_count, ScalarType::kFp32) : Buffer{};
      std::vector<char> host(static_cast<std::size_t>(n * elem));
      std::vector<float> values(static_cast<std::size_t>(n));
      for (const Buffer* b : {&q, &kk, &v, &dout}) {
        for (float& x : values) x = uniform(rng);
        encode_floats(type, values.data(), n, host.data());
        k->copy_from_host(host.data(), *b);
        if (Status s = stream->synchronize(); !s.ok()) run_error(what, s);
      }
      auto timed = [&](auto&& call) {
        call();  // warm-up
        if (Status s = stream->synchronize(); !s.ok()) run_error(what, s);
        const auto t0 = std::chrono::steady_clock::now();
        for (std::int64_t it = 0; it < iters; ++it) call();
        if (Status s = stream->synchronize(); !s.ok()) run_error(what, s);
        if (!k->status().ok()) run_error(what, k->status());
        return seconds_since(t0) / static_cast<double>(iters);
      };
      const double fwd = timed([&] { k->attention_forward(shape, q, kk, v, out, lse, reserve); });
      const double bwd = timed([&] { k->attention_backward(shape, q, kk, v, out, dout, lse, reserve, dq, dk, dv); });
      const double flops = 4.0 * static_cast<double>(batch * heads) * static_cast<double>(seq) *
                           static_cast<double>(seq) * static_cast<double>(d) / 2.0;
      std::printf(
          "{\"backend\": \"%s\", \"device\": \"%s\", \"kernel\": \"%s\", \"algorithm\": \"%s\", \"type\": \"%s\", "
          "\"batch\": %lld, \"seq\": %lld, \"heads\": %lld, \"head_dim\": %lld, \"forward_ms\": %.4f, "
          "\"forward_tflops\": %.2f, \"backward_ms\": %.4f, \"backward_tflops\": %.2f}\n",
          backend.c_str(), device->description().c_str(), kernel.c_str(), pasa ? "pasa" : "standard", type_name.c_str(),
          static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(heads),
          static_cast<long long>(d), fwd * 1e3, flops / fwd / 1e12, bwd * 1e3, 2.5 * flops / bwd / 1e12);
      std::fflush(stdout);
    }
  }
  return 0;
}
