// A CPU emulation of the CUDA execution model, as much of it as runtime/backends/cuda/flash_mma_kernels.h
// uses, so that its kernels run (and are checked) without a GPU. A block's 128 threads are fibers (ucontext)
// run in a new random order at every round, so warps drift against each other as on hardware; the warp
// collectives (ldmatrix, mma.sync m16n8k16, shfl) exchange registers between the 32 lanes as the PTX ISA
// defines them; a cp.async lands either at once or only at the wait, at random, so a tile read before its
// wait, or a buffer refilled while a warp still reads it, gives wrong results. Shared memory starts as NaNs.
// Every shared-memory access is checked for range and 16-byte alignment, every global read for range (the
// buffers the test registers) and a block that deadlocks is stopped; the first violation is kept in error().
//
// Not emulated: fp32 rounding inside the tensor core (sums here are sequential fp32), exp2f's approximation,
// and anything about time. Bank conflicts of ldmatrix are counted (each 8-row matrix is one phase).
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/device/numeric.h"

namespace hzp::test::emu {

constexpr int kThreads = 128;  // every kernel of flash_mma_kernels.h runs 128 threads per block
constexpr int kWarpSize = 32;

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// A barrier for `count` fibers; a fiber waits by yielding until the generation changes.
struct Barrier {
  int count = 0, arrived = 0;
  unsigned generation = 0;
};

struct Fiber {
  ucontext_t context{};
  std::vector<char> stack;
  Dim3 thread_index;
  int lane = 0, warp = 0;
  bool done = false;
  struct Copy {
    void* dst;
    const void* src;
    bool valid;
  };
  std::vector<Copy> pending;  // cp.async not landed yet
};

// What the lanes of a warp exchange in a collective: each writes its part, waits for the other 31, reads.
struct Warp {
  Barrier barrier{kWarpSize};
  const char* op = nullptr;  // the collective the first lane to arrive is in (all 32 must be in the same)
  std::array<const void*, kWarpSize> address{};
  std::array<std::array<std::uint32_t, 4>, kWarpSize> a{};
  std::array<std::array<std::uint32_t, 2>, kWarpSize> b{};
  std::array<float, kWarpSize> f{};
};

// The state of the one block being run (blocks run one after the other).
struct Machine {
  Fiber* current = nullptr;
  ucontext_t scheduler{};
  std::vector<Fiber> fibers = std::vector<Fiber>(kThreads);
  std::array<Warp, kThreads / kWarpSize> warps;
  Barrier block_barrier{kThreads};
  Dim3 block_index, grid_size, block_size{kThreads, 1, 1};
  std::vector<unsigned char> shared = std::vector<unsigned char>(std::size_t{1} << 18);
  unsigned char* shared_base = nullptr;  // 128-byte aligned inside `shared`
  std::size_t shared_bytes = 0;
  std::vector<std::pair<const char*, const char*>> readable;  // global buffers a kernel may read
  std::function<void()> kernel;
  std::mt19937 rng{12345};
  long progress = 0;  // barrier arrivals and finished threads: a round without any is a deadlock
  std::string error;  // the first violation, empty when none
  long ldmatrix_phases = 0, bank_conflicts = 0;
};

inline Machine& machine() {
  static Machine m;
  return m;
}

// Before a test: no violation, no registered buffers, the random order from `seed`.
inline void reset(unsigned seed) {
  Machine& m = machine();
  m.error.clear();
  m.readable.clear();
  m.rng.seed(seed);
  m.ldmatrix_phases = m.bank_conflicts = 0;
}

inline void violation(const std::string& what) {
  Machine& m = machine();
  if (m.error.empty()) m.error = what;
}

inline void yield() {
  Machine& m = machine();
  swapcontext(&m.current->context, &m.scheduler);
}

inline void wait(Barrier& b) {
  const unsigned generation = b.generation;
  ++machine().progress;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  while (b.generation == generation) yield();
}

inline Fiber& self() {
  return *machine().current;
}
inline Warp& own_warp() {
  return machine().warps[static_cast<std::size_t>(self().warp)];
}

// Both waits of a collective: after every lane has written its part (the first lane names the collective,
// the others must be in the same one) and after every lane has read, so the next collective can reuse the slots.
inline void collective_begin(const char* op) {
  Warp& w = own_warp();
  if (w.barrier.arrived == 0) w.op = op;
  if (w.op != op) violation(std::string("divergent warp: ") + op + " meets " + w.op);
  wait(w.barrier);
}
inline void collective_end() {
  wait(own_warp().barrier);
}

inline bool in_shared(const void* p, std::size_t bytes, const char* what) {
  Machine& m = machine();
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < m.shared_base || c + bytes > m.shared_base + m.shared_bytes) {
    violation(std::string(what) + ": outside shared memory");
    return false;
  }
  if ((c - m.shared_base) % 16 != 0) {
    violation(std::string(what) + ": shared address not 16-byte aligned");
    return false;
  }
  return true;
}

inline bool in_global(const void* p, std::size_t bytes) {
  const auto* c = static_cast<const char*>(p);
  if (reinterpret_cast<std::uintptr_t>(c) % 16 != 0) {
    violation("cp.async: global address not 16-byte aligned");
    return false;
  }
  for (const auto& [lo, hi] : machine().readable)
    if (c >= lo && c + bytes <= hi) return true;
  violation("cp.async: global read outside the buffers");
  return false;
}

// --- 16-bit types: the kernels' T; only their size and these conversions are used ----------------------

template <typename T>
float to_float(std::uint16_t bits) {
  if constexpr (std::is_same_v<T, runtime::Bf16>)
    return runtime::from_bf16(runtime::Bf16{bits});
  else
    return runtime::from_fp16(runtime::Fp16{bits});
}
template <typename T>
std::uint16_t from_float(float f) {
  if constexpr (std::is_same_v<T, runtime::Bf16>)
    return runtime::to_bf16(f).bits;
  else
    return runtime::to_fp16(f).bits;
}

// --- the collectives ------------------------------------------------------------------------------------

// ldmatrix.x4: lane l gives the address of row l % 8 of matrix l / 8; lane l receives elements (l / 4,
// 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of each matrix (of its transpose with .trans), lower column low.
inline void ldmatrix(std::uint32_t (&r)[4], const void* p, bool trans) {
  Warp& w = own_warp();
  const int lane = self().lane;
  const bool ok = in_shared(p, 16, "ldmatrix");
  w.address[static_cast<std::size_t>(lane)] = ok ? p : machine().shared_base;
  collective_begin(trans ? "ldmatrix.trans" : "ldmatrix");
  if (lane == 0) {
    for (int m = 0; m < 4; ++m) {  // each 8 x 16-byte matrix is one phase: its rows on distinct banks
      std::array<int, 32> use{};
      for (int row = 0; row < 8; ++row) {
        const auto offset =
            static_cast<const unsigned char*>(w.address[static_cast<std::size_t>(m * 8 + row)]) - machine().shared_base;
        for (int word = 0; word < 4; ++word) ++use[static_cast<std::size_t>((offset / 4 + word) % 32)];
      }
      ++machine().ldmatrix_phases;
      machine().bank_conflicts += *std::max_element(use.begin(), use.end()) - 1;
    }
  }
  const int g = lane / 4, t = lane % 4;
  auto element = [&](int m, int row, int col) {
    return static_cast<std::uint32_t>(
        static_cast<const std::uint16_t*>(w.address[static_cast<std::size_t>(m * 8 + row)])[col]);
  };
  for (int m = 0; m < 4; ++m)
    r[m] = trans ? element(m, 2 * t, g) | (element(m, 2 * t + 1, g) << 16)
                 : element(m, g, 2 * t) | (element(m, g, 2 * t + 1) << 16);
  collective_end();
}

// mma.sync.m16n8k16.row.col, fp32 accumulators (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4,
// t = lane % 4: A's registers hold (g, 2t..), (g+8, 2t..), (g, 8+2t..), (g+8, 8+2t..); B's (k = 2t.., n = g)
// and (k = 8+2t.., n = g); C's (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). Each lane computes its own four.
template <typename T>
void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  Warp& w = own_warp();
  const int lane = self().lane;
  w.a[static_cast<std::size_t>(lane)] = {a[0], a[1], a[2], a[3]};
  w.b[static_cast<std::size_t>(lane)] = {b0, b1};
  collective_begin("mma");
  auto half = [](std::uint32_t reg, int k) { return to_float<T>(static_cast<std::uint16_t>(reg >> (16 * (k % 2)))); };
  auto a_at = [&](int row, int k) {
    const auto& r = w.a[static_cast<std::size_t>((row % 8) * 4 + (k % 8) / 2)];
    return half(r[static_cast<std::size_t>((row / 8) + 2 * (k / 8))], k);
  };
  auto b_at = [&](int k, int n) {
    const auto& r = w.b[static_cast<std::size_t>(n * 4 + (k % 8) / 2)];
    return half(r[static_cast<std::size_t>(k / 8)], k);
  };
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    float sum = c[e];
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
    c[e] = sum;
  }
  collective_end();
}

inline float shfl_xor(float x, int mask) {
  Warp& w = own_warp();
  const int lane = self().lane;
  w.f[static_cast<std::size_t>(lane)] = x;
  collective_begin("shfl");
  const float y = w.f[static_cast<std::size_t>(lane ^ mask)];
  collective_end();
  return y;
}

// --- cp.async -------------------------------------------------------------------------------------------

inline void land(const Fiber::Copy& c) {
  if (c.valid)
    std::memcpy(c.dst, c.src, 16);
  else
    std::memset(c.dst, 0, 16);
}
inline void cp_async16(void* dst, const void* src, bool valid) {
  if (!in_shared(dst, 16, "cp.async") || (valid && !in_global(src, 16))) return;
  const Fiber::Copy c{dst, src, valid};
  if (machine().rng() % 2 != 0)
    land(c);
  else
    self().pending.push_back(c);
}
inline void cp_async_wait_all() {
  for (const auto& c : self().pending) land(c);
  self().pending.clear();
}

// --- launch ---------------------------------------------------------------------------------------------

inline void run_thread() {
  Machine& m = machine();
  m.kernel();
  m.current->done = true;
  ++m.progress;
  swapcontext(&m.current->context, &m.scheduler);
}

// Runs `kernel` (a call of one kernel with its arguments) on every block of `grid`, 128 threads each, with
// `shared_bytes` of dynamic shared memory. Stops at the first violation (machine().error says which).
inline void launch(Dim3 grid, std::size_t shared_bytes, std::function<void()> kernel) {
  Machine& m = machine();
  m.kernel = std::move(kernel);
  m.grid_size = grid;
  const auto base = reinterpret_cast<std::uintptr_t>(m.shared.data());
  m.shared_base = m.shared.data() + (128 - base % 128) % 128;
  m.shared_bytes = shared_bytes;
  if (shared_bytes + 128 > m.shared.size()) return violation("launch: more shared memory than emulated");
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x && m.error.empty(); ++x) {
        m.block_index = Dim3{x, y, z};
        std::fill(m.shared.begin(), m.shared.end(), 0xff);  // NaN in both 16-bit formats and in fp32
        m.block_barrier = Barrier{kThreads};
        for (auto& w : m.warps) w.barrier = Barrier{kWarpSize};
        for (int i = 0; i < kThreads; ++i) {
          Fiber& f = m.fibers[static_cast<std::size_t>(i)];
          f.stack.resize(std::size_t{1} << 18);
          f.thread_index = Dim3{static_cast<unsigned>(i), 0, 0};
          f.lane = i % kWarpSize, f.warp = i / kWarpSize, f.done = false;
          f.pending.clear();
          getcontext(&f.context);
          f.context.uc_stack.ss_sp = f.stack.data();
          f.context.uc_stack.ss_size = f.stack.size();
          f.context.uc_link = nullptr;
          makecontext(&f.context, run_thread, 0);
        }
        std::vector<int> order(kThreads);
        for (int i = 0; i < kThreads; ++i) order[static_cast<std::size_t>(i)] = i;
        for (bool alive = true; alive && m.error.empty();) {
          alive = false;
          const long before = m.progress;
          std::shuffle(order.begin(), order.end(), m.rng);
          for (int i : order) {
            Fiber& f = m.fibers[static_cast<std::size_t>(i)];
            if (f.done) continue;
            alive = true;
            m.current = &f;
            swapcontext(&m.scheduler, &f.context);
          }
          if (alive && m.progress == before) violation("deadlock: every thread waits at a barrier");
        }
        for (const auto& f : m.fibers)
          if (!f.pending.empty()) violation("cp.async never waited for");
      }
}

}  // namespace hzp::test::emu

// --- the primitives flash_mma_kernels.h is written against ---------------------------------------------

#define HZP_DEVICE inline
#define HZP_KERNEL
#define threadIdx (::hzp::test::emu::self().thread_index)
#define blockIdx (::hzp::test::emu::machine().block_index)
#define blockDim (::hzp::test::emu::machine().block_size)
#define gridDim (::hzp::test::emu::machine().grid_size)

namespace hzp::runtime::cuda::flash_mma {

template <typename T>
void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  test::emu::mma<T>(c, a, b0, b1);
}
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  test::emu::ldmatrix(r, p, false);
}
inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  test::emu::ldmatrix(r, p, true);
}
inline void cp_async16(void* dst, const void* src, bool valid) {
  test::emu::cp_async16(dst, src, valid);
}
inline void cp_async_commit() {}  // one group at a time: the kernels wait for all
inline void cp_async_wait_all() {
  test::emu::cp_async_wait_all();
}
template <typename T>
std::uint32_t pack2(float lo, float hi) {
  return test::emu::from_float<T>(lo) | (static_cast<std::uint32_t>(test::emu::from_float<T>(hi)) << 16);
}
template <typename T>
void unpack2(std::uint32_t r, float& lo, float& hi) {
  lo = test::emu::to_float<T>(static_cast<std::uint16_t>(r & 0xffffu));
  hi = test::emu::to_float<T>(static_cast<std::uint16_t>(r >> 16));
}
inline float round_fp16(float x) {
  return runtime::round_to(runtime::ScalarType::kFp16, x);
}
inline unsigned char* shared_memory() {
  return test::emu::machine().shared_base;
}
inline void sync_threads() {
  test::emu::wait(test::emu::machine().block_barrier);
}
inline float shfl_xor(float x, int mask) {
  return test::emu::shfl_xor(x, mask);
}

}  // namespace hzp::runtime::cuda::flash_mma

#include "runtime/backends/cuda/flash_mma_kernels.h"
