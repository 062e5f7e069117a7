// Drivers and pybind11 bindings of the LLM kernels (hetero.ops.llm): threading, argument checks, the weight
// repacking, the KV cache. Compiled without ISA flags; the hot loops run through the LlmKernels table.
// Tuning knobs (read once): HETERO_LLM_TASKS = N equal tasks per thread of a GEMV/GEMM (default 4; 1 = one
// contiguous stream per thread; 0 = shrinking chunks, see split_rows), HETERO_LLM_PF = bytes the 8-bit one-row
// decode tiles prefetch ahead of the weight stream, into L2 (default 3072; 0 = none; the 4/5/6-bit tiles never
// prefetch: llm_impl.hpp, prefetch_record), HETERO_LLM_PF_ROWS = the same for the 8-bit tiles of 2-16 rows (default
// 0), HETERO_LLM_PF_L1 = the same into L1 for calls of more than 16 rows (prefill; default 0),
// HETERO_LLM_BLOCKS=1 = decode GEMVs split by bytes, one block per thread (bsplit::run_blocks; the tasks knob then
// does not apply to them; unset: the fused q / k / v calls only; 0: none), HETERO_LLM_PFNEXT = bytes of the next
// merged-step matmul's block prefetched after one (with the split by bytes; default 0),
// HETERO_LLM_HUGE=0 = the repacked weights and the KV cache on the allocator's ordinary pages (see WeightArena),
// HETERO_LLM_KVTOUCH=0 = a decode step's attention without the read-ahead of its KV lines (touch_head).
// HETERO_LLM_ORDER=0 = the pool's threads take equal tasks in index order, not in per-thread runs (claim_order).
// HETERO_LLM_VBMI=0 = the plain VNNI kernel table on a CPU that also has VBMI + GFNI (lk(); llm_use_vbmi).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "elementwise.hpp"
#include "kv_quant.hpp"
#include "llm.hpp"
#include "step.hpp"
#include "threadpool_stats.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

namespace py = pybind11;

namespace hetero {
pybind11::dict pool_stats_dict(const PoolStats& s);  // module.cpp
namespace llm {
#ifndef HETERO_LLM_X86
const LlmKernels* llm_kernels_avx2() { return nullptr; }
const LlmKernels* llm_kernels_avx512() { return nullptr; }
const LlmKernels* llm_kernels_avx512vnni() { return nullptr; }
const LlmKernels* llm_kernels_avx512vbmi() { return nullptr; }
#endif
namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// ------------------------------------------------------------------------------------------------ dispatch
bool cpu_has(const char* what) {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (std::string(what) == "avx512vnni") return __builtin_cpu_supports("avx512vnni");
  if (std::string(what) == "avx512vbmi") return __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
  if (std::string(what) == "f16c") return __builtin_cpu_supports("f16c");
#endif
  (void)what;
  return false;
}

std::atomic<bool> g_use_vnni{true};
// The VNNI path's VBMI + GFNI variant, where the CPU has it (HETERO_LLM_VBMI=0: the plain VNNI tables, for A/B runs).
std::atomic<bool> g_use_vbmi{[] { const char* e = std::getenv("HETERO_LLM_VBMI"); return !e || std::atoi(e) != 0; }()};

const LlmKernels& lk() {
  static const bool vnni = llm_kernels_avx512vnni() != nullptr && cpu_has("avx512vnni");
  static const bool vbmi = vnni && llm_kernels_avx512vbmi() != nullptr && cpu_has("avx512vbmi");
  static const bool f16c = cpu_has("f16c");
  const Kernels* a = &active();
  if (a == kernels_avx512() && a != nullptr) {
    if (vnni && g_use_vnni.load(std::memory_order_relaxed)) {
      if (vbmi && g_use_vbmi.load(std::memory_order_relaxed)) return *llm_kernels_avx512vbmi();
      return *llm_kernels_avx512vnni();
    }
    return *llm_kernels_avx512();
  }
  if (a == kernels_avx2() && a != nullptr && f16c) return *llm_kernels_avx2();
  return *llm_kernels_generic();
}

// ------------------------------------------------------------------------------------------------ scratch
template <typename T>
struct Scratch {  // grow-only, 64-byte aligned; grows on the first calls, then never again
  T* p = nullptr;
  std::size_t cap = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p); }
  T* get(std::size_t n) {
    if (n > cap) {
      std::free(p);
      std::size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
      p = static_cast<T*>(std::aligned_alloc(64, bytes ? bytes : 64));
      if (!p) throw std::bad_alloc();
      cap = n;
    }
    return p;
  }
};

struct XQBuf {
  Scratch<std::int8_t> q;
  Scratch<float> d, ds;
  Scratch<std::int32_t> s, sl;
  // x quantized for weights pk (their block size, pair4 order and activation scale block, x_scale_block).
  XQ make(const LlmKernels& kr, const float* x, i64 M, i64 ldx, i64 k, const QPack& pk, bool parallel) {
    const int bs = pk.bs, sbs = x_scale_block(kr, pk);
    const bool pair4 = pk.nibbles();
    const i64 nb = (k + bs - 1) / bs;
    XQ r{q.get(static_cast<std::size_t>(M * nb * bs)), d.get(static_cast<std::size_t>(M * nb)),
         s.get(static_cast<std::size_t>(M * nb)), ds.get(static_cast<std::size_t>(M * nb)),
         sl.get(static_cast<std::size_t>(M * nb)), nb * bs, nb, M};
    auto* qp = const_cast<std::int8_t*>(r.q);
    auto* dp = const_cast<float*>(r.d);
    auto* sp = const_cast<std::int32_t*>(r.s);
    auto* dsp = const_cast<float*>(r.ds);
    auto* slp = const_cast<std::int32_t*>(r.sl);
    const int nt = parallel ? threads_for(static_cast<double>(M * k), 32768.0) : 1;
    if (nt <= 1) {
      kr.quantize_x(x, M, ldx, k, bs, sbs, pair4, qp, dp, sp, dsp, slp);
    } else {
      const i64 chunk = (M + nt - 1) / nt;
      parallel_for(nt, nt, [&](i64 t) {
        const i64 m0 = t * chunk, m1 = std::min(M, m0 + chunk);
        if (m0 < m1)
          kr.quantize_x(x + m0 * ldx, m1 - m0, ldx, k, bs, sbs, pair4, qp + m0 * r.ldq, dp + m0 * nb,
                        sp + m0 * nb, dsp + m0 * nb, slp + m0 * nb);
      });
    }
    return r;
  }
};

XQBuf& tl_xq(int slot) {
  thread_local XQBuf bufs[2];
  return bufs[slot];
}

Scratch<float>& tl_f(int slot) {
  thread_local Scratch<float> bufs[8];
  return bufs[slot];
}

bool is_c(const py::array& a) { return (a.flags() & py::array::c_style) != 0; }

template <typename T>
bool has_type(const py::array& a) {
  const py::dtype d = a.dtype();
  return d.normalized_num() == py::dtype::of<T>().normalized_num() && d.byteorder() != '>';
}

void need_f32c(const py::array& a, const char* fn, const char* name) {
  if (!has_type<float>(a)) fail(std::string(fn) + ": " + name + " must be float32");
  if (!is_c(a)) fail(std::string(fn) + ": " + name + " must be C-contiguous");
}

void need_out(const py::array& a, const char* fn) {
  need_f32c(a, fn, "out");
  if (!a.writeable()) fail(std::string(fn) + ": out must be writable");
}

float* fptr(const py::array& a) { return static_cast<float*>(const_cast<void*>(a.data())); }
const float* cfptr(const py::array& a) { return static_cast<const float*>(a.data()); }

// ------------------------------------------------------------------------------------------------ weights
// Memory of the repacked weights: what a decode step streams, ~all of its bytes. On 4 KiB pages the stream crosses
// a page (a TLB miss, a two-level page walk under a hypervisor) every 64 cache lines; on 2 MiB pages every 32768.
// Weights are carved, 64-byte aligned and back to back, out of 2 MiB-aligned chunks of at least 32 MiB that ask
// Linux for transparent huge pages (advise_huge). A chunk is freed with the last weight carved from it (the arena
// itself keeps none alive). HETERO_LLM_HUGE=0: one ordinary aligned allocation per weight (as before), and the KV
// cache on ordinary pages.
bool huge_pages_on() {
  static const bool huge = [] { const char* e = std::getenv("HETERO_LLM_HUGE"); return !e || std::atoi(e) != 0; }();
  return huge;
}

constexpr std::size_t kHugePage = std::size_t{1} << 21;

// Asks Linux for transparent huge pages on [p, p + len) (unless HETERO_LLM_HUGE=0): the default "madvise" THP mode
// grants them for each whole, 2 MiB-aligned 2 MiB of the range when first touched; "never" leaves 4 KiB pages, as
// does any other system. Advice: refused or unsupported, nothing changes.
void advise_huge(void* p, std::size_t len) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge_pages_on()) madvise(p, len, MADV_HUGEPAGE);
#else
  (void)p;
  (void)len;
#endif
}

// `bytes` of zeroed memory starting at a 2 MiB boundary, mapped lazily (a page is resident once touched) and
// advised huge; the mapping is not rounded up to 2 MiB, so its tail stays on 4 KiB pages and costs no more than
// calloc's would.
std::shared_ptr<std::uint8_t> huge_zeroed(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
#if defined(__unix__) || defined(__APPLE__)
  const std::size_t len = (bytes + 4095) / 4096 * 4096;
  void* m = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  auto* base = static_cast<std::uint8_t*>(m);
  const std::size_t head = (kHugePage - reinterpret_cast<std::uintptr_t>(base) % kHugePage) % kHugePage;
  std::uint8_t* p = base + head;
  if (head) munmap(base, head);                            // the slack before the boundary
  if (kHugePage - head) munmap(p + len, kHugePage - head);  // and after the range
  advise_huge(p, len);
  return {p, [len](std::uint8_t* q) { munmap(q, len); }};
#else
  auto* base = static_cast<std::uint8_t*>(std::calloc(1, bytes + kHugePage));
  if (!base) throw std::bad_alloc();
  std::uint8_t* p = base + (kHugePage - reinterpret_cast<std::uintptr_t>(base) % kHugePage) % kHugePage;
  return {p, [base](std::uint8_t*) { std::free(base); }};
#endif
}

struct WeightArena {
  static constexpr std::size_t kChunk = std::size_t{32} << 20;
  std::mutex mu;
  std::weak_ptr<std::uint8_t> chunk;  // the chunk being carved (freed with its weights: the arena does not hold it)
  std::size_t used = 0, cap = 0;

  static std::shared_ptr<std::uint8_t> alloc(std::size_t align, std::size_t bytes) {
    auto* p = static_cast<std::uint8_t*>(std::aligned_alloc(align, bytes));
    if (!p) throw std::bad_alloc();
    return {p, [](std::uint8_t* q) { std::free(q); }};
  }
  // bytes (64-byte aligned, not zeroed) and the owner that keeps them alive
  std::pair<std::uint8_t*, std::shared_ptr<std::uint8_t>> take(std::size_t bytes) {
    bytes = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
    if (!huge_pages_on()) {
      std::shared_ptr<std::uint8_t> own = alloc(64, bytes);
      return {own.get(), own};
    }
    std::lock_guard<std::mutex> lk(mu);
    std::shared_ptr<std::uint8_t> cur = chunk.lock();
    if (!cur || cap - used < bytes) {
      cap = std::max(kChunk, (bytes + kHugePage - 1) / kHugePage * kHugePage);
      cur = alloc(kHugePage, cap);
      advise_huge(cur.get(), cap);
      chunk = cur;
      used = 0;
    }
    std::uint8_t* p = cur.get() + used;
    used += bytes;
    return {p, cur};
  }
};
WeightArena& weight_arena() {
  static WeightArena* arena = new WeightArena();  // never destroyed: weights may outlive static destruction
  return *arena;
}

// A weight matrix (or a stack of expert matrices) for QMatMul / MoE: quantized (repacked) or float (read in place).
struct Weights {
  bool quant = false;
  QPack pk;               // quantized
  std::uint8_t* packed = nullptr;
  std::shared_ptr<std::uint8_t> mem;  // what holds `packed` (WeightArena)
  i64 expert_bytes = 0;   // repacked bytes per expert
  int wt = W_F32;         // float
  py::object keep;        // float: the source array (kept alive, read in place)
  const void* fdata = nullptr;
  i64 experts = 1, n = 0, k = 0;

  const std::uint8_t* group(i64 e, i64 g) const { return packed + e * expert_bytes + g * pk.group_bytes; }
  const void* frow(i64 e, i64 row) const {
    const i64 es = wt == W_F32 ? 4 : 2;
    return static_cast<const char*>(fdata) + ((e * n + row) * k) * es;
  }
};

// Repack one expert's [N, row_bytes] source rows into the RB16 layout (see llm.hpp).
void repack(const QPack& pk, const std::uint8_t* src, std::uint8_t* dst) {
  const i64 src_blk = (pk.asym ? 4 : 2) + pk.bs * pk.bits / 8;
  const i64 row_bytes = pk.nb * src_blk;
  const int bs = pk.bs;
  std::memset(dst, 0, static_cast<std::size_t>(pk.groups * pk.group_bytes));
  for (i64 g = 0; g < pk.groups; ++g) {
    for (i64 b = 0; b < pk.nb; ++b) {
      std::uint8_t* rec = dst + g * pk.group_bytes + b * pk.rec_bytes;
      std::uint8_t* qv = rec + pk.header_bytes();
      for (int j = 0; j < QR; ++j) {
        const i64 row = g * QR + j;
        if (row >= pk.n) {
          // Padding rows: zero scales; quants must still make isum - offset*sx vanish -> store the offset value.
          if (pk.bits == 8 && !pk.asym)
            for (int t = 0; t < bs / 4; ++t) std::memset(qv + t * 64 + j * 4, 0x80, 4);
          if (pk.bits == 4 && !pk.asym)
            for (int t = 0; t < bs / 8; ++t) std::memset(qv + t * 64 + j * 4, 0x88, 4);
          continue;
        }
        const std::uint8_t* blk = src + row * row_bytes + b * src_blk;
        std::memcpy(rec + 2 * j, blk, 2);
        if (pk.asym) std::memcpy(rec + 32 + 2 * j, blk + 2, 2);
        const std::uint8_t* q = blk + (pk.asym ? 4 : 2);
        if (pk.bits == 8) {
          for (int t = 0; t < bs / 4; ++t)
            for (int c = 0; c < 4; ++c)
              qv[t * 64 + j * 4 + c] = pk.asym ? q[4 * t + c] : static_cast<std::uint8_t>(q[4 * t + c] ^ 0x80);
        } else {
          // Source: byte p holds element p (low) and p + B/2 (high) -- exactly the pairing of the repacked bytes.
          for (int t = 0; t < bs / 8; ++t)
            for (int c = 0; c < 4; ++c) qv[t * 64 + j * 4 + c] = q[4 * t + c];
        }
      }
    }
  }
}

std::shared_ptr<Weights> make_weights(const py::array& w, const std::string& wtype, int block_size, bool symmetric,
                                      i64 k) {
  const char* fn = "llm_weights";
  auto out = std::make_shared<Weights>();
  if (w.ndim() != 2 && w.ndim() != 3) fail(std::string(fn) + ": weight must be 2-D [N, row] or 3-D [E, N, row]");
  if (!is_c(w)) fail(std::string(fn) + ": weight must be C-contiguous");
  out->experts = w.ndim() == 3 ? w.shape(0) : 1;
  out->n = w.shape(w.ndim() - 2);
  out->k = k;
  if (k < 1) fail(std::string(fn) + ": K must be positive");
  const i64 row = w.shape(w.ndim() - 1);
  QPack& pk = out->pk;
  pk.n = out->n;
  pk.k = k;
  const bool ggml = ggml_pack(wtype, pk);  // GGUF block formats (llm_ggml.cpp)
  if (ggml || wtype == "q4" || wtype == "q8") {
    if (!has_type<std::uint8_t>(w)) fail(std::string(fn) + ": quantized weights must be uint8");
    i64 need = 0;
    if (ggml) {
      const i64 per = pk.kq ? 256 : 32;
      if (k % per) fail(std::string(fn) + ": " + wtype + " rows need a multiple of " + std::to_string(per) +
                        " elements; K=" + std::to_string(k));
      need = ggml_row_bytes(pk);
    } else {
      if (block_size != 32 && block_size != 64 && block_size != 128) fail(std::string(fn) + ": block size 32/64/128");
      pk.bits = wtype == "q4" ? 4 : 8;
      pk.bs = block_size;
      pk.asym = !symmetric;
      pk.layout();
      need = pk.nb * ((pk.asym ? 4 : 2) + block_size * pk.bits / 8);
    }
    if (row != need)
      fail(std::string(fn) + ": rows hold " + std::to_string(row) + " bytes; K=" + std::to_string(k) + " needs " +
           std::to_string(need));
    out->quant = true;
    out->expert_bytes = pk.groups * pk.group_bytes;
    const std::size_t total = static_cast<std::size_t>(out->experts * out->expert_bytes);
    std::tie(out->packed, out->mem) = weight_arena().take(total);
    const auto* src = static_cast<const std::uint8_t*>(w.data());
    const i64 e_src = out->n * row;
    const i64 E = out->experts;
    std::uint8_t* dst = out->packed;
    const i64 eb = out->expert_bytes;
    py::gil_scoped_release nogil;
    if (ggml) {  // decoding GGUF blocks costs more: spread every expert's groups over the threads, in chunks
      const i64 G = pk.groups;
      const int nt = threads_for(static_cast<double>(E * pk.n * k), 1 << 20);
      const i64 per = std::max<i64>(1, G / (4 * nt)), cpe = (G + per - 1) / per;  // groups per chunk, chunks/expert
      parallel_for(E * cpe, nt, [&](i64 c) {
        const i64 e = c / cpe, g0 = (c % cpe) * per;
        ggml_repack(pk, src + e * e_src, dst + e * eb, g0, std::min(G, g0 + per));
      });
    } else {
      parallel_for(E, E > 1 ? num_threads() : 1, [&](i64 e) { repack(out->pk, src + e * e_src, dst + e * eb); });
    }
    return out;
  }
  if (wtype == "f32") {
    if (!has_type<float>(w)) fail(std::string(fn) + ": f32 weights must be float32");
    out->wt = W_F32;
  } else if (wtype == "f16") {
    if (!has_type<std::uint16_t>(w) && w.dtype().kind() != 'f') fail(std::string(fn) + ": f16 weights: float16");
    if (w.itemsize() != 2) fail(std::string(fn) + ": f16 weights must be float16");
    out->wt = W_F16;
  } else if (wtype == "bf16") {
    if (w.itemsize() != 2) fail(std::string(fn) + ": bf16 weights must be uint16 bit patterns");
    out->wt = W_BF16;
  } else {
    fail(std::string(fn) + ": unknown wtype '" + wtype + "'");
  }
  if (row != k) fail(std::string(fn) + ": rows hold " + std::to_string(row) + " elements; K=" + std::to_string(k));
  out->keep = w;
  out->fdata = w.data();
  return out;
}

// Task t of a GEMV/GEMM over n row units (16-row groups, 4-row quads) covers [b[t], b[t+1]); the pool's threads
// claim the tasks in order. Default: 4 equal tasks per thread (the split every published measurement used).
// HETERO_LLM_TASKS=0: shrinking chunks, each 1/(2 nt) of what is left (at least one unit), so a thread that finishes
// early takes small pieces of the rest instead of waiting on another's long tail; not yet measured on a quiet
// machine, so not the default. The results do not depend on the split: every unit is computed whole by one thread.
int split_tasks_per_thread() {
  static const int per = [] { const char* e = std::getenv("HETERO_LLM_TASKS"); return e ? std::atoi(e) : 4; }();
  return per;
}
bool split_shrinks() { return split_tasks_per_thread() <= 0; }

// The order in which the pool's threads take a split's k tasks: claim c (the pool hands tasks out in index order)
// runs task order[c]. Index order had the threads alternate, each hopping over the other's tasks: a new weight
// stream per task, ~5-10% of a 2-thread decode GEMV's streaming rate (benchmarks/qgemm_rows.py --calls 4 against
// --calls 1). Here the tasks are nt runs of consecutive ones, claims dealt round-robin over the runs: while the
// threads keep pace each reads one contiguous range, and the claims stay dynamic (a late thread's tasks are still
// taken by the others). Only calls of up to 16 rows take it (a prefill's matmuls are compute-bound and keep index
// order). HETERO_LLM_ORDER=0: index order. Every task is computed whole: the results do not depend on it.
std::vector<i64> claim_order(i64 k, int nt) {
  static const bool runs = [] { const char* e = std::getenv("HETERO_LLM_ORDER"); return !e || std::atoi(e) != 0; }();
  std::vector<i64> order(static_cast<std::size_t>(std::max<i64>(k, 0)));
  for (i64 c = 0; c < k; ++c) order[static_cast<std::size_t>(c)] = c;
  if (!runs || nt <= 1 || k <= nt || split_shrinks()) return order;
  std::size_t c = 0;
  for (i64 j = 0; c < order.size(); ++j)
    for (int r = 0; r < nt; ++r) {
      const i64 a = k * r / nt + j;  // run r: tasks [k r / nt, k (r + 1) / nt)
      if (a < k * (r + 1) / nt) order[c++] = a;
    }
  return order;
}

std::vector<i64> split_rows(i64 n, int nt) {
  const int per = split_tasks_per_thread();
  std::vector<i64> b{0};
  if (nt <= 1 || n <= 1) {
    b.push_back(n);
  } else if (per > 0) {  // equal tasks
    const i64 k = std::min<i64>(n, static_cast<i64>(nt) * per);
    for (i64 t = 1; t <= k; ++t) b.push_back(n * t / k);
  } else {
    for (i64 at = 0; at < n;) {
      at = std::min(n, at + std::max<i64>(1, (n - at) / (2 * nt)));
      b.push_back(at);
    }
  }
  return b;
}

namespace fused {

// Weights of one part, its output and bias; x quantized for its block format.
struct Part {
  const Weights* w;
  float* y;
  const float* bias;
  XQ xq;
};

// Outputs y[m, g*16, ...) of the M (<= ROWS) rows, groups [g0, g1) of one part (+ bias): matmul_core's loop
// for M <= ROWS (tiles of up to max_mr rows per group, one while M <= max_mr).
inline void groups(const LlmKernels& kr, const Part& p, i64 M, i64 g0, i64 g1) {
  const i64 N = p.w->n;
  for (i64 g = g0; g < g1; ++g)
    for (i64 m = 0; m < M; m += kr.max_mr)
      kr.qgemm_group(p.w->pk, p.w->group(0, g), p.xq, m, static_cast<int>(std::min<i64>(kr.max_mr, M - m)),
                     p.y + m * N + g * QR, N, static_cast<int>(std::min<i64>(QR, N - g * QR)));
  if (p.bias)
    for (i64 m = 0; m < M; ++m)
      for (i64 j = g0 * QR; j < std::min(N, g1 * QR); ++j) p.y[m * N + j] += p.bias[j];
}

}  // namespace fused

namespace bsplit {

// ---- the decode split by bytes (HETERO_LLM_BLOCKS=1 for every decode GEMV; by default the fused q / k / v calls
// only, see blocks_mode: dec15 measured it 0.3-4% slower than the equal tasks for every call by the CPU time of a
// busy machine at 2 threads, which counts spinning and preempted workers; dec17's clean runs, q+k+v faster) ----
// A call's weights are segments of units (16-row groups; gate + up: one unit = both matrices' group g) laid end to
// end; thread t's block is the t-th nt-th of their bytes, which it claims in chunks of ~32 KiB, one contiguous
// stream; a thread out of its block takes the back half of what is left of another's (see run_blocks). Then it
// prefetches into L2 the start of its block of the step's next matmul (LlmStep sets tl_next; HETERO_LLM_PFNEXT
// bytes, default 0), which it reads next: the read overlaps the wait for the other threads, the norms, the rotary
// and the attention between the two calls. The results do not depend on the split: every unit is computed whole by
// one thread, with the kernels the equal tasks use.
struct Seg {
  const Weights* w[2];  // w[1]: a second matrix read at the same groups (SwiGLU's up), or nullptr
  i64 units() const { return w[0]->pk.groups; }
  i64 unit_bytes() const { return w[0]->pk.group_bytes + (w[1] ? w[1]->pk.group_bytes : 0); }
};
using Plan = std::vector<Seg>;
thread_local const Plan* tl_next = nullptr;  // the weights of the next matmul op of the LlmStep running

// The plan of a decode call of these weights (paired: one segment reading both, SwiGLU's gate and up); empty when
// they do not take the split (float or stacked weights).
Plan plan_of(const std::vector<const Weights*>& ws, bool paired = false) {
  Plan p;
  for (const Weights* w : ws)
    if (!w->quant || w->experts != 1) return {};
  if (paired && ws.size() == 2) return {{{ws[0], ws[1]}}};
  for (const Weights* w : ws) p.push_back({{w, nullptr}});
  return p;
}

// HETERO_LLM_BLOCKS: 1 = every decode GEMV split by bytes; 0 = none; unset (2) = the fused q / k / v calls only
// (llm_matmul_multi: three matrices, 24 equal tasks at 2 threads, the small k / v ones 74-139 KB). Measured on
// the clean runs of a busy machine (decode_threads.py --per-op --clock cpu, 2 threads; dec17): q+k+v 5-14% faster
// split by bytes on the Qwen3-0.6B Q4_K_M / Q8_0 files; gate+up+SwiGLU up to 6% slower on Q8_0 (its blocks
// alternate gate and up groups every ~32 KiB chunk, where an equal task reads its gate rows, then its up rows).
// 3 (opt-in) = the fused q / k / v calls and every one-matrix decode GEMV of at least kBigBytes of weights (the LM
// head: 8 equal tasks of 17-24 MB, so in a clean call one thread idled 67-349 us at the end while the other streamed
// alone; split by bytes, 1-3 us). bw32 (gemv_threads.py --splits 2,3): yet its clean calls were 3-20 % slower at load
// 4 (0-4 % faster at load 8-9, fewer calls; its threads stream slower, as dec15 saw), whole steps not resolved, so it
// is not the default. llm_decode_split sets the mode at run time (benchmarks, tests): every mode computes each unit
// whole on one thread, so the results are the same bits.
std::atomic<int> g_blocks_mode{[] { const char* e = std::getenv("HETERO_LLM_BLOCKS"); return e ? std::atoi(e) : 2; }()};
constexpr double kBigBytes = 16.0 * (1 << 20);
int blocks_mode() { return g_blocks_mode.load(std::memory_order_relaxed); }
bool blocks_on() { return blocks_mode() == 1; }
bool blocks_multi() { return blocks_mode() != 0; }
// whether a one-matrix decode call of these weights is split by bytes
bool blocks_for(const Weights& w) {
  const int mode = blocks_mode();
  const double bytes = static_cast<double>(w.pk.groups) * static_cast<double>(w.pk.group_bytes);
  return mode == 1 || (mode == 3 && bytes >= kBigBytes);
}
std::size_t pf_next_bytes() {
  static const std::size_t b = [] {
    const char* e = std::getenv("HETERO_LLM_PFNEXT");
    return e ? static_cast<std::size_t>(std::max(0, std::atoi(e))) : std::size_t{0};
  }();
  return b;
}

struct Layout {
  std::vector<i64> first;  // unit index where segment p starts (size P + 1)
  std::vector<i64> cut;    // block boundaries (size nt + 1)
  double total = 0;        // bytes
  Layout(const Plan& plan, int nt) : first{0}, cut{0} {
    for (const Seg& s : plan) {
      first.push_back(first.back() + s.units());
      total += static_cast<double>(s.units() * s.unit_bytes());
    }
    for (int t = 1; t < nt; ++t) {  // the unit nearest the byte t / nt of the whole
      double at = total * t / nt;
      std::size_t p = 0;
      while (p + 1 < plan.size() && at >= static_cast<double>(plan[p].units() * plan[p].unit_bytes())) {
        at -= static_cast<double>(plan[p].units() * plan[p].unit_bytes());
        ++p;
      }
      const i64 u = first[p] + static_cast<i64>(at / static_cast<double>(plan[p].unit_bytes()) + 0.5);
      cut.push_back(std::clamp(u, cut.back(), first.back()));
    }
    cut.push_back(first.back());
  }
  // f(segment, u0, u1) for the units [a, b) of the whole, cut at the segments' ends
  template <class F>
  void each(i64 a, i64 b, F&& f) const {
    for (std::size_t p = 0; p + 1 < first.size() && a < b; ++p)
      if (a < first[p + 1]) {
        const i64 e = std::min(b, first[p + 1]);
        f(static_cast<int>(p), a - first[p], e - first[p]);
        a = e;
      }
  }
};

int plan_threads(const Plan& plan) {  // fused::threads() for a one-row call of these weights
  double work = 0;
  for (const Seg& s : plan)
    for (const Weights* w : s.w)
      if (w) work += static_cast<double>(w->n) * static_cast<double>(w->k);
  return threads_for(work, 65536.0);
}

// Into L2: the first `bytes` of thread t's block of the plan at nt threads.
void prefetch_block(const Plan& plan, int t, int nt, std::size_t bytes) {
  if (plan_threads(plan) != nt) return;  // that call splits otherwise: another thread's bytes
  const Layout lay(plan, nt);
  std::size_t left = bytes;
  const std::size_t b = static_cast<std::size_t>(t);
  lay.each(lay.cut[b], lay.cut[b + 1], [&](int p, i64 u0, i64 u1) {
    for (i64 u = u0; u < u1 && left > 0; ++u)
      for (const Weights* w : plan[static_cast<std::size_t>(p)].w) {
        if (!w) continue;
        const char* g = reinterpret_cast<const char*>(w->group(0, u));
        for (i64 o = 0; o < w->pk.group_bytes; o += 64) __builtin_prefetch(g + o, 0, 2);
        left -= std::min<std::size_t>(left, static_cast<std::size_t>(w->pk.group_bytes));
      }
  });
}

// Runs f(segment, u0, u1) over every unit of the plan once, split across nt threads as above.
template <class F>
void run_blocks(const Plan& plan, int nt, const F& f) {
  const Plan* next = tl_next;
  const std::size_t pf = next ? pf_next_bytes() : 0;
  const Layout lay(plan, nt);
  if (nt <= 1) {
    lay.each(0, lay.first.back(), f);
    if (pf) prefetch_block(*next, 0, 1, pf);
    return;
  }
  const i64 chunk = std::max<i64>(1, static_cast<i64>(32768.0 * static_cast<double>(lay.first.back()) / lay.total));
  struct alignas(64) Cursor {
    std::atomic<std::uint64_t> fb;  // front << 32 | back: the units of the thread's range not yet claimed
  };
  std::unique_ptr<Cursor[]> cur(new Cursor[static_cast<std::size_t>(nt)]);
  const auto pack = [](i64 f, i64 b) { return static_cast<std::uint64_t>(f) << 32 | static_cast<std::uint64_t>(b); };
  for (int t = 0; t < nt; ++t)
    cur[t].fb.store(pack(lay.cut[static_cast<std::size_t>(t)], lay.cut[static_cast<std::size_t>(t) + 1]),
                    std::memory_order_relaxed);
  // The owner claims a chunk from the front of its range; a thread out of work takes the back half of another's
  // range (all of it when that is one chunk or less) and makes it its own: one contiguous stream each, a new one
  // only per steal (the halving keeps steals few), and no thread waits on a late or descheduled one's share.
  const auto claim_front = [&](Cursor& c, i64& a, i64& b) {
    std::uint64_t v = c.fb.load(std::memory_order_relaxed);
    for (;;) {
      const i64 f = static_cast<i64>(v >> 32), e = static_cast<i64>(v & 0xffffffffu);
      if (f >= e) return false;
      a = f;
      b = std::min(e, f + chunk);
      if (c.fb.compare_exchange_weak(v, pack(b, e), std::memory_order_relaxed)) return true;
    }
  };
  const auto steal_half = [&](Cursor& c, i64& a, i64& b) {
    std::uint64_t v = c.fb.load(std::memory_order_relaxed);
    for (;;) {
      const i64 f = static_cast<i64>(v >> 32), e = static_cast<i64>(v & 0xffffffffu);
      if (f >= e) return false;
      a = e - f <= chunk ? f : f + (e - f) / 2;
      b = e;
      if (c.fb.compare_exchange_weak(v, pack(f, a), std::memory_order_relaxed)) return true;
    }
  };
  parallel_for(nt, nt, [&](i64 t) {
    Cursor& mine = cur[t];
    for (;;) {
      i64 a, b;
      while (claim_front(mine, a, b)) lay.each(a, b, f);
      bool stole = false;
      for (i64 d = 1; d < nt && !stole; ++d) stole = steal_half(cur[(t + d) % nt], a, b);
      if (!stole) break;
      mine.fb.store(pack(a, b), std::memory_order_relaxed);  // empty until now: no one else writes it
    }
    if (pf) prefetch_block(*next, static_cast<int>(t), nt, pf);
  });
}

// range(g0, g1) over every 16-row group of a one-segment plan's weights (groups of them), split across nt threads:
// by bytes (HETERO_LLM_BLOCKS=1), else in equal runs of groups (split_rows).
template <class F>
void run_groups(const Plan& plan, i64 groups, int nt, const F& range) {
  if (blocks_on()) {
    run_blocks(plan, nt, [&](int, i64 g0, i64 g1) { range(g0, g1); });
    return;
  }
  const std::vector<i64> b = split_rows(groups, nt);
  const std::vector<i64> order = claim_order(static_cast<i64>(b.size()) - 1, nt);
  parallel_for(static_cast<i64>(b.size()) - 1, nt, [&](i64 c) {
    const std::size_t t = static_cast<std::size_t>(order[static_cast<std::size_t>(c)]);
    range(b[t], b[t + 1]);
  });
}

}  // namespace bsplit

// y[M, N] (row stride ldy) = x[M, K] @ W_e^T (+ bias). xq: x already quantized (quantized weights) or nullptr.
void matmul_core(const Weights& w, i64 e, const float* x, i64 M, i64 ldx, const XQ* xq, float* y, i64 ldy,
                 const float* bias) {
  const LlmKernels& kr = lk();
  const i64 N = w.n, K = w.k;
  if (w.quant) {
    const QPack& pk = w.pk;
    const i64 G = pk.groups;
    const int mr = kr.max_mr;
    const i64 mchunk = M <= 64 ? M : 64;
    const double work = static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(M <= 4 ? 1 : M);
    const int nt = threads_for(work, 65536.0);
    if (M <= mr && e == 0 && w.experts == 1 && ldy == N && bsplit::blocks_for(w)) {  // decode: fused::groups' loop
      const fused::Part part{&w, y, bias, *xq};
      bsplit::run_blocks(bsplit::Plan{{{&w, nullptr}}}, nt, [&](int, i64 g0, i64 g1) {
        fused::groups(kr, part, M, g0, g1);
      });
      return;
    }
    const std::vector<i64> split = split_rows(G, nt);
    // runs for the weight-streaming calls of up to 16 rows (decode, verify); prefill keeps index order
    const std::vector<i64> order = claim_order(static_cast<i64>(split.size()) - 1, M <= 16 ? nt : 1);
    parallel_for(static_cast<i64>(split.size()) - 1, nt, [&](i64 c) {
      const i64 t = order[static_cast<std::size_t>(c)];
      const i64 g0 = split[t], g1 = split[t + 1];
      for (i64 mc = 0; mc < M; mc += mchunk) {
        const i64 mend = std::min(M, mc + mchunk);
        for (i64 g = g0; g < g1; ++g) {
          const int nvalid = static_cast<int>(std::min<i64>(QR, N - g * QR));
          const std::uint8_t* grp = w.group(e, g);
          for (i64 m = mc; m < mend; m += mr) {
            const int r = static_cast<int>(std::min<i64>(mr, mend - m));
            kr.qgemm_group(pk, grp, *xq, m, r, y + m * ldy + g * QR, ldy, nvalid);
          }
        }
        if (bias)
          for (i64 m = mc; m < mend; ++m)
            for (i64 j = g0 * QR; j < std::min(N, g1 * QR); ++j) y[m * ldy + j] += bias[j];
      }
    });
    return;
  }
  // Float weights: tiles of 4 weight rows x 4 x rows, blocks of 64 x rows for the cache.
  const i64 NQ = (N + 3) / 4;
  const double work = static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(M <= 4 ? 1 : M);
  const int nt = threads_for(work, 65536.0);
  const std::vector<i64> split = split_rows(NQ, nt);
  parallel_for(static_cast<i64>(split.size()) - 1, nt, [&](i64 t) {
    const i64 q0 = split[t], q1 = split[t + 1];
    float tmp[16];
    for (i64 mc = 0; mc < M; mc += 64) {
      const i64 mend = std::min(M, mc + 64);
      for (i64 q = q0; q < q1; ++q) {
        const int rows = static_cast<int>(std::min<i64>(4, N - q * 4));
        for (i64 m = mc; m < mend; m += 4) {
          const int r = static_cast<int>(std::min<i64>(4, mend - m));
          kr.fgemm_tile(w.wt, w.frow(e, q * 4), K, rows, K, x + m * ldx, ldx, r, tmp, 4);
          for (int i = 0; i < r; ++i)
            for (int j = 0; j < rows; ++j)
              y[(m + i) * ldy + q * 4 + j] = tmp[i * 4 + j] + (bias ? bias[q * 4 + j] : 0.f);
        }
      }
    }
  });
}

void matmul(const Weights& w, i64 e, const float* x, i64 M, i64 ldx, float* y, i64 ldy, const float* bias, int slot) {
  if (M <= 0) return;
  if (w.quant) {
    XQ xq = tl_xq(slot).make(lk(), x, M, ldx, w.k, w.pk, M >= 16);
    matmul_core(w, e, x, M, ldx, &xq, y, ldy, bias);
  } else {
    matmul_core(w, e, x, M, ldx, nullptr, y, ldy, bias);
  }
}

struct PyWeights {
  std::shared_ptr<Weights> w;
};

// Op and run_now (step.hpp): the py_* entry points run one at once; an LlmStep (below) runs a list of them in one
// native call.

Op prep_qmatmul(const PyWeights& pw, const py::array& x, const py::array& out, const py::object& bias_obj) {
  const char* fn = "llm_matmul";
  const Weights& w = *pw.w;
  need_f32c(x, fn, "x");
  need_out(out, fn);
  if (x.ndim() < 1 || x.shape(x.ndim() - 1) != w.k) fail(std::string(fn) + ": x's last dim must be K");
  const i64 M = x.ndim() == 0 ? 1 : x.size() / w.k;
  if (out.size() != M * w.n) fail(std::string(fn) + ": out must hold M x N floats");
  const float* bias = nullptr;
  if (!bias_obj.is_none()) {
    py::array b = py::reinterpret_borrow<py::array>(bias_obj);
    need_f32c(b, fn, "bias");
    if (b.size() != w.n) fail(std::string(fn) + ": bias must hold N floats");
    bias = cfptr(b);
  }
  if (w.experts != 1) fail(std::string(fn) + ": a stacked expert weight needs moe()");
  const float* px = cfptr(x);
  float* py_ = fptr(out);
  const Weights* wp = &w;
  return [wp, px, py_, M, bias] { matmul(*wp, 0, px, M, wp->k, py_, wp->n, bias, 0); };
}

void py_qmatmul(const PyWeights& pw, const py::array& x, const py::array& out, const py::object& bias_obj) {
  run_now(prep_qmatmul, pw, x, out, bias_obj);
}

// silu(g) * u over n elements into o: SwiGLU's two vector passes (py_swiglu runs them per thread chunk).
inline void swiglu_rows(const Kernels& kr, const float* g, const float* u, float* o, i64 n) {
  kr.unary(U_SILU, g, o, n, 0.f, 0.f);
  kr.binary(B_MUL, BM_VV, o, u, o, n);
}

// ------------------------------------------------------------------------------------------------ fused decode
// The decode step's matmuls fused so that fewer parallel regions (each a wake-up and a barrier for every thread)
// and fewer calls run per step; hetero_cpu.fuse makes them from the replay's bound calls. Each computes exactly
// what the unfused calls compute, with the same kernels on the same values (a 16-row group of up to the table's
// max_mr activation rows is one qgemm_group call either way), and writes every output the unfused calls write.
// Quantized weights and at most max_mr rows (decode; a batched step's rows, one per sequence) run in one parallel
// region; anything else falls back to the unfused calls in order.
namespace fused {

// x quantized once per distinct block format of the parts (at most 4 distinct ones in a call).
void quantize_parts(const LlmKernels& kr, const float* x, i64 M, std::vector<Part>& parts) {
  thread_local XQBuf bufs[4];
  std::vector<std::pair<std::tuple<int, int, bool>, int>> made;  // (bs, scale block, pair4) -> part holding it
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const QPack& pk = parts[i].w->pk;
    const std::tuple<int, int, bool> key{pk.bs, x_scale_block(kr, pk), pk.nibbles()};
    auto it = std::find_if(made.begin(), made.end(), [&](const auto& m) { return m.first == key; });
    if (it != made.end()) {
      parts[i].xq = parts[static_cast<std::size_t>(it->second)].xq;
    } else {
      parts[i].xq = bufs[made.size()].make(kr, x, M, parts[i].w->k, parts[i].w->k, pk, false);
      made.push_back({key, static_cast<int>(i)});
    }
  }
}

// The rows a fused call takes: a decode step's one, a batched step's slots, a speculative verify step's up to 16
// (hetero_cpu.fuse.ROWS; more than max_mr rows run as several tiles per group, the weights still read once).
constexpr i64 ROWS = 16;

bool fusable(const std::vector<const Weights*>& ws, i64 M) {
  if (M < 1 || M > ROWS || ws.size() > 4) return false;
  for (const Weights* w : ws)
    if (!w->quant || w->experts != 1) return false;
  return true;
}

// Tasks over the groups of every part. Equal tasks (the default split): split_rows per part, so each keeps the
// split of its own call (q / k / v: the small k and v tasks come last). Shrinking chunks (HETERO_LLM_TASKS=0): one
// split_rows over the parts' groups laid end to end, a chunk that straddles two parts cut in two, so the chunks
// shrink towards the end of the whole region, not of each part.
struct Task {
  int part;
  i64 g0, g1;
};
std::vector<Task> tasks(const std::vector<Part>& parts, int nt) {
  std::vector<Task> out;
  if (!split_shrinks()) {
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const std::vector<i64> b = split_rows(parts[p].w->pk.groups, nt);
      for (std::size_t t = 0; t + 1 < b.size(); ++t) out.push_back({static_cast<int>(p), b[t], b[t + 1]});
    }
    return out;
  }
  i64 total = 0;
  for (const Part& p : parts) total += p.w->pk.groups;
  const std::vector<i64> b = split_rows(total, nt);
  std::size_t p = 0;
  i64 base = 0;  // part p holds the groups [base, base + its groups) of the whole
  for (std::size_t t = 0; t + 1 < b.size(); ++t)
    for (i64 a = b[t]; a < b[t + 1];) {
      while (a >= base + parts[p].w->pk.groups) base += parts[p++].w->pk.groups;
      const i64 e = std::min(b[t + 1], base + parts[p].w->pk.groups);
      out.push_back({static_cast<int>(p), a - base, e - base});
      a = e;
    }
  return out;
}

int threads(const std::vector<Part>& parts, i64 M) {  // matmul_core's count for the parts' work together
  double work = 0;
  for (const Part& p : parts) work += static_cast<double>(p.w->n) * static_cast<double>(p.w->k);
  return threads_for(work * static_cast<double>(M <= 4 ? 1 : M), 65536.0);
}

}  // namespace fused

const Weights& weights_of(const py::handle& h, const char* fn) {
  try {
    return *h.cast<const PyWeights&>().w;
  } catch (const py::cast_error&) {
    fail(std::string(fn) + ": weights must be LlmWeights");
  }
}

const float* opt_bias(const py::handle& b, i64 n, const char* fn) {
  if (b.is_none()) return nullptr;
  py::array a = py::reinterpret_borrow<py::array>(b);
  need_f32c(a, fn, "bias");
  if (a.size() != n) fail(std::string(fn) + ": bias must hold N floats");
  return cfptr(a);
}

// outs[i][..., N_i] = x[..., K] @ W_i^T (+ bias_i): several matmuls of one input (q / k / v) in one region.
Op prep_qmatmul_multi(const py::list& ws, const py::array& x, const py::list& outs, const py::list& biases) {
  const char* fn = "llm_matmul_multi";
  const std::size_t n = ws.size();
  if (n == 0 || outs.size() != n || biases.size() != n)
    fail(std::string(fn) + ": weights, outs and biases must be lists of one length (>= 1)");
  need_f32c(x, fn, "x");
  std::vector<const Weights*> w(n);
  std::vector<fused::Part> parts(n);
  i64 M = 0;
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = &weights_of(ws[i], fn);
    if (w[i]->experts != 1) fail(std::string(fn) + ": a stacked expert weight needs moe()");
    if (x.ndim() < 1 || x.shape(x.ndim() - 1) != w[i]->k) fail(std::string(fn) + ": x's last dim must be K");
    M = x.size() / w[i]->k;
    py::array o = py::reinterpret_borrow<py::array>(outs[i]);
    need_out(o, fn);
    if (o.size() != M * w[i]->n) fail(std::string(fn) + ": out must hold M x N floats");
    parts[i] = {w[i], fptr(o), opt_bias(biases[i], w[i]->n, fn), XQ{}};
  }
  const float* px = cfptr(x);
  bsplit::Plan plan = bsplit::plan_of(w);
  return [w = std::move(w), parts = std::move(parts), plan = std::move(plan), px, M]() mutable {
    if (!fused::fusable(w, M)) {
      for (const fused::Part& p : parts) matmul(*p.w, 0, px, M, p.w->k, p.y, p.w->n, p.bias, 0);
      return;
    }
    const LlmKernels& kr = lk();
    fused::quantize_parts(kr, px, M, parts);
    const int nt = fused::threads(parts, M);
    if (bsplit::blocks_multi()) {
      bsplit::run_blocks(plan, nt, [&](int p, i64 g0, i64 g1) {
        fused::groups(kr, parts[static_cast<std::size_t>(p)], M, g0, g1);
      });
      return;
    }
    const std::vector<fused::Task> ts = fused::tasks(parts, nt);
    parallel_for(static_cast<i64>(ts.size()), nt, [&](i64 t) {
      const fused::Task& k = ts[static_cast<std::size_t>(t)];
      fused::groups(kr, parts[static_cast<std::size_t>(k.part)], M, k.g0, k.g1);
    });
  };
}

void py_qmatmul_multi(const py::list& ws, const py::array& x, const py::list& outs, const py::list& biases) {
  run_now(prep_qmatmul_multi, ws, x, outs, biases);
}

// gate = x @ Wg^T (+ bg), up = x @ Wu^T (+ bu), out = silu(gate) * up (SwiGLU): one region, the activation
// applied to each task's rows as soon as both halves are computed (gate and up are written too).
Op prep_qmatmul_swiglu(const PyWeights& pg, const PyWeights& pu, const py::array& x, const py::array& gate,
                        const py::array& up, const py::array& out, const py::object& bg, const py::object& bu) {
  const char* fn = "llm_matmul_swiglu";
  const Weights& wg = *pg.w;
  const Weights& wu = *pu.w;
  need_f32c(x, fn, "x");
  need_out(gate, fn);
  need_out(up, fn);
  need_out(out, fn);
  if (wg.experts != 1 || wu.experts != 1) fail(std::string(fn) + ": a stacked expert weight needs moe()");
  if (wg.n != wu.n || wg.k != wu.k) fail(std::string(fn) + ": gate and up weights must have one shape");
  if (x.ndim() < 1 || x.shape(x.ndim() - 1) != wg.k) fail(std::string(fn) + ": x's last dim must be K");
  const i64 M = x.size() / wg.k, N = wg.n;
  if (gate.size() != M * N || up.size() != M * N || out.size() != M * N)
    fail(std::string(fn) + ": gate, up and out must hold M x N floats");
  std::vector<fused::Part> parts{{&wg, fptr(gate), opt_bias(bg, N, fn), XQ{}},
                                 {&wu, fptr(up), opt_bias(bu, N, fn), XQ{}}};
  float* o = fptr(out);
  const float* px = cfptr(x);
  const Weights* pwg = &wg;
  const Weights* pwu = &wu;
  return [parts = std::move(parts), pwg, pwu, o, px, M, N]() mutable {
    const Weights& wg = *pwg;
    const Weights& wu = *pwu;
    const Kernels& base = active();
    if (!fused::fusable({&wg, &wu}, M)) {
      matmul(wg, 0, px, M, wg.k, parts[0].y, N, parts[0].bias, 0);
      matmul(wu, 0, px, M, wu.k, parts[1].y, N, parts[1].bias, 0);
      swiglu_rows(base, parts[0].y, parts[1].y, o, M * N);
      return;
    }
    const LlmKernels& kr = lk();
    fused::quantize_parts(kr, px, M, parts);
    const int nt = fused::threads(parts, M);
    auto range = [&](i64 g0, i64 g1) {
      fused::groups(kr, parts[0], M, g0, g1);
      fused::groups(kr, parts[1], M, g0, g1);
      const i64 a = g0 * QR, e = std::min(N, g1 * QR);
      for (i64 m = 0; m < M && a < e; ++m)
        swiglu_rows(base, parts[0].y + m * N + a, parts[1].y + m * N + a, o + m * N + a, e - a);
    };
    bsplit::run_groups(bsplit::Plan{{{&wg, &wu}}}, wg.pk.groups, nt, range);
  };
}

void py_qmatmul_swiglu(const PyWeights& pg, const PyWeights& pu, const py::array& x, const py::array& gate,
                       const py::array& up, const py::array& out, const py::object& bg, const py::object& bu) {
  run_now(prep_qmatmul_swiglu, pg, pu, x, gate, up, out, bg, bu);
}

// out = x @ W^T (+ bias), then res_out = residual + out (the residual add in the matmul's epilogue, per task's
// rows; res_out may be residual itself).
Op prep_qmatmul_residual(const PyWeights& pw, const py::array& x, const py::array& out,
                          const py::object& bias_obj, const py::array& residual, const py::array& res_out) {
  const char* fn = "llm_matmul_residual";
  const Weights& w = *pw.w;
  need_f32c(x, fn, "x");
  need_out(out, fn);
  need_f32c(residual, fn, "residual");
  need_out(res_out, fn);
  if (w.experts != 1) fail(std::string(fn) + ": a stacked expert weight needs moe()");
  if (x.ndim() < 1 || x.shape(x.ndim() - 1) != w.k) fail(std::string(fn) + ": x's last dim must be K");
  const i64 M = x.size() / w.k, N = w.n;
  if (out.size() != M * N || residual.size() != M * N || res_out.size() != M * N)
    fail(std::string(fn) + ": out, residual and res_out must hold M x N floats");
  std::vector<fused::Part> parts{{&w, fptr(out), opt_bias(bias_obj, N, fn), XQ{}}};
  const float* r = cfptr(residual);
  float* ro = fptr(res_out);
  const float* px = cfptr(x);
  const Weights* pw_ = &w;
  return [parts = std::move(parts), pw_, r, ro, px, M, N]() mutable {
    const Weights& w = *pw_;
    const Kernels& base = active();
    if (!fused::fusable({&w}, M)) {
      matmul(w, 0, px, M, w.k, parts[0].y, N, parts[0].bias, 0);
      base.binary(B_ADD, BM_VV, r, parts[0].y, ro, M * N);
      return;
    }
    const LlmKernels& kr = lk();
    fused::quantize_parts(kr, px, M, parts);
    const int nt = fused::threads(parts, M);
    auto range = [&](i64 g0, i64 g1) {
      fused::groups(kr, parts[0], M, g0, g1);
      const i64 a = g0 * QR, e = std::min(N, g1 * QR);
      for (i64 m = 0; m < M && a < e; ++m)
        base.binary(B_ADD, BM_VV, r + m * N + a, parts[0].y + m * N + a, ro + m * N + a, e - a);
    };
    bsplit::run_groups(bsplit::Plan{{{&w, nullptr}}}, w.pk.groups, nt, range);
  };
}

void py_qmatmul_residual(const PyWeights& pw, const py::array& x, const py::array& out, const py::object& bias_obj,
                         const py::array& residual, const py::array& res_out) {
  run_now(prep_qmatmul_residual, pw, x, out, bias_obj, residual, res_out);
}


// best[m] = numpy's argmax of row m of out = x @ W^T (+ bias): the LM head of a greedy step. Each task reduces the
// columns it just wrote (in L1) and merges its (value, index) under a lock -- a handful of tasks a call -- so the
// caller does not read the 152k cold logits again (64-67 us a step in numpy, tiny33). The merge is a total order
// (a NaN first, else the larger value, then the lower index), so the result does not depend on the split.
namespace fused {
struct Best {
  float v;
  i64 i;  // -1: none yet
  bool nan;
  void merge(float ov, i64 oi) {
    const bool onan = ov != ov;
    if (i < 0 || (onan && (!nan || oi < i)) || (!onan && !nan && (ov > v || (ov == v && oi < i)))) {
      v = ov;
      i = oi;
      nan = onan;
    }
  }
};
}  // namespace fused

Op prep_qmatmul_argmax(const PyWeights& pw, const py::array& x, const py::array& out, const py::object& bias_obj,
                        const py::array& best) {
  const char* fn = "llm_matmul_argmax";
  const Weights& w = *pw.w;
  need_f32c(x, fn, "x");
  need_out(out, fn);
  if (!has_type<std::int64_t>(best) || !is_c(best) || !best.writeable())
    fail(std::string(fn) + ": best must be a writable C-contiguous int64 array");
  if (w.experts != 1) fail(std::string(fn) + ": a stacked expert weight needs moe()");
  if (x.ndim() < 1 || x.shape(x.ndim() - 1) != w.k) fail(std::string(fn) + ": x's last dim must be K");
  const i64 M = x.size() / w.k, N = w.n;
  if (out.size() != M * N) fail(std::string(fn) + ": out must hold M x N floats");
  if (best.size() != M) fail(std::string(fn) + ": best must hold M indices");
  if (N < 1) fail(std::string(fn) + ": N must be >= 1");
  std::vector<fused::Part> parts{{&w, fptr(out), opt_bias(bias_obj, N, fn), XQ{}}};
  auto* pb = static_cast<std::int64_t*>(const_cast<void*>(best.data()));
  const float* px = cfptr(x);
  const Weights* pw_ = &w;
  return [parts = std::move(parts), pw_, pb, px, M, N]() mutable {
    const Weights& w = *pw_;
    const LlmKernels& kr = lk();
    if (!fused::fusable({&w}, M)) {
      matmul(w, 0, px, M, w.k, parts[0].y, N, parts[0].bias, 0);
      float v;
      for (i64 m = 0; m < M; ++m) pb[m] = kr.argmax(parts[0].y + m * N, N, &v);
      return;
    }
    fused::quantize_parts(kr, px, M, parts);
    const int nt = fused::threads(parts, M);
    std::vector<fused::Best> acc(static_cast<std::size_t>(M), fused::Best{0.f, -1, false});
    std::mutex lock;
    auto range = [&](i64 g0, i64 g1) {
      fused::groups(kr, parts[0], M, g0, g1);
      const i64 a = g0 * QR, e = std::min(N, g1 * QR);
      if (a >= e) return;
      float v[fused::ROWS];
      i64 at[fused::ROWS];
      for (i64 m = 0; m < M; ++m) at[m] = a + kr.argmax(parts[0].y + m * N + a, e - a, &v[m]);
      const std::lock_guard<std::mutex> hold(lock);
      for (i64 m = 0; m < M; ++m) acc[static_cast<std::size_t>(m)].merge(v[m], at[m]);
    };
    const bsplit::Plan plan{{{&w, nullptr}}};
    if (M <= kr.max_mr && bsplit::blocks_for(w))  // the split matmul_core takes for this call
      bsplit::run_blocks(plan, nt, [&](int, i64 g0, i64 g1) { range(g0, g1); });
    else
      bsplit::run_groups(plan, w.pk.groups, nt, range);
    for (i64 m = 0; m < M; ++m) pb[m] = acc[static_cast<std::size_t>(m)].i;
  };
}

void py_qmatmul_argmax(const PyWeights& pw, const py::array& x, const py::array& out, const py::object& bias_obj,
                       const py::array& best) {
  run_now(prep_qmatmul_argmax, pw, x, out, bias_obj, best);
}

// ------------------------------------------------------------------------------------------------ small ops
Op prep_swiglu(const py::array& gate, const py::array& up, const py::array& out) {
  const char* fn = "llm_swiglu";
  need_f32c(gate, fn, "gate");
  need_f32c(up, fn, "up");
  need_out(out, fn);
  if (gate.size() != up.size() || out.size() != gate.size()) fail(std::string(fn) + ": sizes differ");
  const float* g = cfptr(gate);
  const float* u = cfptr(up);
  float* o = fptr(out);
  const i64 n = gate.size();
  return [g, u, o, n] {
    const Kernels& kr = active();
    const int nt = threads_for(static_cast<double>(n), 16384.0);
    const i64 chunk = (((n + nt - 1) / nt) + 15) / 16 * 16;
    parallel_for(nt, nt, [&](i64 t) {
      const i64 a = t * chunk, b = std::min(n, a + chunk);
      if (a >= b) return;
      swiglu_rows(kr, g + a, u + a, o + a, b - a);
    });
  };
}

void py_swiglu(const py::array& gate, const py::array& up, const py::array& out) {
  run_now(prep_swiglu, gate, up, out);
}

// Rotary embedding with a cos/sin table grown on demand (positions x half), shared by the nodes of one model.
struct RopeTable {
  std::vector<double> inv_freq;
  double scale = 1.0;
  int half = 0;
  std::vector<float> cs;  // [P][2][half]: cos then sin
  i64 rows = 0;
  void ensure(i64 p) {
    if (p <= rows) return;
    i64 want = std::max<i64>(p, std::max<i64>(rows * 2, 256));
    cs.resize(static_cast<std::size_t>(want * 2 * half));
    for (i64 pos = rows; pos < want; ++pos)
      for (int i = 0; i < half; ++i) {
        const double a = static_cast<double>(pos) * inv_freq[static_cast<std::size_t>(i)];
        cs[static_cast<std::size_t>((pos * 2) * half + i)] = static_cast<float>(std::cos(a) * scale);
        cs[static_cast<std::size_t>((pos * 2 + 1) * half + i)] = static_cast<float>(std::sin(a) * scale);
      }
    rows = want;
  }
};

// Rows [0, T) of x [T, H, D] rotated into y: row t at position pos[t] (pos null: past + t).
void rope_apply(const RopeTable& tab, const float* px, float* po, i64 T, i64 H, i64 D, const std::int64_t* pos,
                i64 past) {
  const int half = tab.half;
  for (i64 t = 0; t < T; ++t) {
    const float* c = tab.cs.data() + ((pos ? pos[t] : past + t) * 2) * half;
    const float* s = c + half;
    for (i64 h = 0; h < H; ++h) {
      const float* xi = px + (t * H + h) * D;
      float* yo = po + (t * H + h) * D;
      for (int i = 0; i < half; ++i) {
        const float x1 = xi[i], x2 = xi[i + half];
        const float a = x1 * c[i], b = x2 * s[i], e = x2 * c[i], f = x1 * s[i];
        yo[i] = a - b;
        yo[i + half] = e + f;
      }
      if (xi != yo)
        for (i64 i = 2 * half; i < D; ++i) yo[i] = xi[i];
    }
  }
}

void rope_check(const RopeTable& tab, const py::array& x, const py::array& out, const char* fn) {
  need_f32c(x, fn, "x");
  need_out(out, fn);
  if (x.ndim() != 3 || out.size() != x.size()) fail(std::string(fn) + ": x must be [T, heads, head_dim]");
  if (2 * tab.half > x.shape(2)) fail(std::string(fn) + ": rotary_dim exceeds head_dim");
}

void py_rope(RopeTable& tab, const py::array& x, const py::array& out, i64 past) {
  const char* fn = "llm_rope";
  rope_check(tab, x, out, fn);
  if (past < 0) fail(std::string(fn) + ": past_len must be >= 0");
  const i64 T = x.shape(0);
  tab.ensure(past + T);
  const float* px = cfptr(x);
  float* po = fptr(out);
  py::gil_scoped_release nogil;
  rope_apply(tab, px, po, T, x.shape(1), x.shape(2), nullptr, past);
}

// An op with a check that must pass, under the GIL and before any op of its step runs, for the op to do what its
// unfused call would do (false: that call would refuse its arguments; an LlmStep then runs the unfused calls).
struct StepOp {
  std::function<bool()> check;  // empty: always runs
  Op run;
};

// past_len as the replay holds it: a one-element int64 array, read when the op runs (it changes every step).
const std::int64_t* past_ptr(const py::array& past, const char* fn) {
  if (!has_type<std::int64_t>(past) || !is_c(past) || past.size() != 1)
    fail(std::string(fn) + ": past_len must be a one-element int64 array");
  return static_cast<const std::int64_t*>(past.data());
}

// py_rope at the position the array holds when it runs; the check grows the table (shared by the model's nodes).
StepOp prep_rope_at(RopeTable& tab, const py::array& x, const py::array& out, const py::array& past) {
  const char* fn = "llm_rope";
  rope_check(tab, x, out, fn);
  const std::int64_t* pp = past_ptr(past, fn);
  const i64 T = x.shape(0), H = x.shape(1), D = x.shape(2);
  RopeTable* tp = &tab;
  const float* px = cfptr(x);
  float* po = fptr(out);
  return {[tp, pp, T] {
            if (*pp < 0) return false;
            tp->ensure(*pp + T);
            return true;
          },
          [tp, px, po, T, H, D, pp] { rope_apply(*tp, px, po, T, H, D, nullptr, *pp); }};
}

// A step of several sequences: row t at its own position positions[t] (int64 [T]), in one call.
void py_rope_rows(RopeTable& tab, const py::array& x, const py::array& out, const py::array& positions) {
  const char* fn = "llm_rope.rows";
  rope_check(tab, x, out, fn);
  const i64 T = x.shape(0);
  if (!has_type<std::int64_t>(positions) || !is_c(positions) || positions.size() != T)
    fail(std::string(fn) + ": positions must be int64 [T], one per row of x");
  const auto* pos = static_cast<const std::int64_t*>(positions.data());
  i64 top = 0;
  for (i64 t = 0; t < T; ++t) {
    if (pos[t] < 0) fail(std::string(fn) + ": positions must be >= 0");
    top = std::max(top, pos[t] + 1);
  }
  tab.ensure(top);
  const float* px = cfptr(x);
  float* po = fptr(out);
  py::gil_scoped_release nogil;
  rope_apply(tab, px, po, T, x.shape(1), x.shape(2), pos, 0);
}

void py_embedding(const py::array& ids, const py::array& table, const std::string& wtype, int bs, bool sym, i64 dim,
                  const py::array& out) {
  const char* fn = "llm_embedding";
  need_out(out, fn);
  if (!is_c(ids) || !is_c(table)) fail(std::string(fn) + ": ids and table must be C-contiguous");
  const bool i64ids = has_type<std::int64_t>(ids);
  if (!i64ids && !has_type<std::int32_t>(ids)) fail(std::string(fn) + ": ids must be int64 or int32");
  if (table.ndim() != 2) fail(std::string(fn) + ": table must be 2-D");
  const i64 n = ids.size(), V = table.shape(0), row = table.shape(1);
  if (out.size() != n * dim) fail(std::string(fn) + ": out must hold len(ids) x dim floats");
  std::vector<i64> idx(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) {
    idx[static_cast<std::size_t>(i)] = i64ids ? static_cast<const std::int64_t*>(ids.data())[i]
                                              : static_cast<const std::int32_t*>(ids.data())[i];
    const i64 v = idx[static_cast<std::size_t>(i)];
    if (v < 0 || v >= V)
      fail("token id " + std::to_string(v) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
  const auto* base = static_cast<const std::uint8_t*>(table.data());
  float* po = fptr(out);
  if (wtype == "f32" || wtype == "f16" || wtype == "bf16") {
    if (row != dim) fail(std::string(fn) + ": table rows must hold dim elements");
    const i64 es = wtype == "f32" ? 4 : 2;
    if (table.itemsize() != es) fail(std::string(fn) + ": table dtype does not match wtype");
    py::gil_scoped_release nogil;
    for (i64 i = 0; i < n; ++i) {
      const std::uint8_t* r = base + idx[static_cast<std::size_t>(i)] * row * es;
      float* o = po + i * dim;
      if (es == 4) {
        std::memcpy(o, r, static_cast<std::size_t>(dim) * 4);
      } else if (wtype == "f16") {
        lk().f16_to_f32(reinterpret_cast<const std::uint16_t*>(r), o, dim);
      } else {
        const auto* h = reinterpret_cast<const std::uint16_t*>(r);
        for (i64 j = 0; j < dim; ++j) o[j] = bf16_to_float(h[j]);
      }
    }
    return;
  }
  QPack gp;
  gp.n = 1;
  gp.k = dim;
  if (ggml_pack(wtype, gp)) {  // GGUF block formats: one row dequantized per token
    if (!has_type<std::uint8_t>(table)) fail(std::string(fn) + ": a quantized table must be uint8");
    if (dim % (gp.kq ? 256 : 32) || row != ggml_row_bytes(gp))
      fail(std::string(fn) + ": " + wtype + " rows hold the wrong number of bytes for dim");
    py::gil_scoped_release nogil;
    for (i64 i = 0; i < n; ++i) ggml_dequant_row(gp, base + idx[static_cast<std::size_t>(i)] * row, po + i * dim);
    return;
  }
  if (wtype != "q4" && wtype != "q8") fail(std::string(fn) + ": unknown wtype '" + wtype + "'");
  if (!has_type<std::uint8_t>(table)) fail(std::string(fn) + ": a quantized table must be uint8");
  const int bits = wtype == "q4" ? 4 : 8;
  const i64 hdr = sym ? 2 : 4, blk = hdr + bs * bits / 8, nb = (dim + bs - 1) / bs;
  if (row != nb * blk) fail(std::string(fn) + ": quantized rows hold the wrong number of bytes for dim");
  py::gil_scoped_release nogil;
  for (i64 i = 0; i < n; ++i) {
    const std::uint8_t* r = base + idx[static_cast<std::size_t>(i)] * row;
    float* o = po + i * dim;
    for (i64 b = 0; b < nb; ++b) {
      const std::uint8_t* p = r + b * blk;
      std::uint16_t dh, mh = 0;
      std::memcpy(&dh, p, 2);
      if (!sym) std::memcpy(&mh, p + 2, 2);
      const float d = half_to_float(dh), m = sym ? 0.f : half_to_float(mh);
      const std::uint8_t* q = p + hdr;
      for (int j = 0; j < bs; ++j) {
        const i64 col = b * bs + j;
        if (col >= dim) break;
        float v;
        if (bits == 8) {
          v = sym ? d * static_cast<float>(static_cast<std::int8_t>(q[j])) : d * static_cast<float>(q[j]) + m;
        } else {
          const int nib = j < bs / 2 ? (q[j] & 15) : (q[j - bs / 2] >> 4);
          v = sym ? d * static_cast<float>(nib - 8) : d * static_cast<float>(nib) + m;
        }
        o[col] = v;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------ attention
constexpr i64 RB = 32;  // query rows (query position x head of the group) per task

// The KV cache of one layer: K in tiles of KT positions stored transposed ([d][KT]) so that scores for 64 positions
// are 64-wide vector FMAs, V row by row ([position][d]); float16 (default), float32, or int8 (q8) with one float
// scale per block of KVB values of a (position, head) row: a q8 K tile is int8 [d][KT] followed by its scales
// [nb][KT]; V's scales are rows of their own ([position][nb]). The rotated low-bit types (q4r / q3r, kv_quant.hpp)
// store rotated rows as packed codes with a float16 scale per 32 values: a K tile row (one dimension, 64 positions)
// is two packed blocks, the tile's scales follow as float16 [nb][KT]; a V row is d/32 packed blocks, its scales
// float16 [position][nb]. Their keys are stored centred: k - kmean, kmean (per kv head) the mean of the first (up to
// 64) keys of the step that wrote position 0 (hetero.contract.kv_rotated.key_mean). Subtracting one vector from
// every key moves all of a query's scores by the same q . kmean, which the softmax cancels exactly, and it removes
// the large constant part of real models' keys (a K bias: |k| up to ~360 in Qwen2.5's first layer) that would
// otherwise set every block's scale. Positions are quantized independently, so rolling back (overwriting from any
// past_len > 0) needs nothing special; a step at position 0 starts a new mean.
// Memory: position-ordered blocks of KT positions, each holding every kv head's [K tile | V rows | V scales] (64-byte
// aligned parts), in one lazily mapped range on 2 MiB pages (huge_zeroed; a cache under 2 MiB is carved from the
// weight arena's chunks instead): a step at position p touches the pages of blocks <= p / KT only, one 2 MiB page
// holds several blocks of all heads (a decode step's attention reads its layer's whole cache through one or a few
// TLB entries instead of a 4 KiB page per 64 lines), and a long context costs memory only as it fills.
struct Attention {
  i64 hkv = 0, max_ctx = 0, d = 0, ntiles = 0;
  int kind = KV_F16;
  std::shared_ptr<std::uint8_t> mem;  // the blocks (allocated at the first write)
  std::size_t voff = 0, soff = 0, head_bytes = 0, block_bytes = 0;  // within a block: a head's V rows, V scales; sizes
  std::vector<float> kmean;  // q4r / q3r: [hkv][d], the keys' centre
  i64 filled = 0;
  bool rotated() const { return kind == KV_Q4R || kind == KV_Q3R; }
  int bits() const { return kind == KV_Q4R ? 4 : 3; }  // rotated types only
  i64 nb() const { return (d + KVB - 1) / KVB; }
  // bytes of one V row, of one K tile row (64 positions of one dimension), of one row's scales
  std::size_t vrow_bytes() const {
    if (rotated()) return static_cast<std::size_t>(nb() * kvq::block_bytes(bits()));
    return static_cast<std::size_t>(d) * (kind == KV_F32 ? 4 : (kind == KV_F16 ? 2 : 1));
  }
  std::size_t krow_bytes() const {
    if (rotated()) return static_cast<std::size_t>(2 * kvq::block_bytes(bits()));
    return static_cast<std::size_t>(KT) * (kind == KV_F32 ? 4 : (kind == KV_F16 ? 2 : 1));
  }
  std::size_t scale_bytes() const { return kind == KV_Q8 ? 4 : (rotated() ? 2 : 0); }  // per scale
  std::size_t vs_row_bytes() const { return static_cast<std::size_t>(nb()) * scale_bytes(); }
  std::size_t tile_bytes() const {
    return static_cast<std::size_t>(d) * krow_bytes() + static_cast<std::size_t>(nb() * KT) * scale_bytes();
  }
  void alloc() {
    auto up64 = [](std::size_t b) { return (b + 63) / 64 * 64; };
    ntiles = (max_ctx + KT - 1) / KT;
    voff = up64(tile_bytes());
    soff = voff + up64(static_cast<std::size_t>(KT) * vrow_bytes());
    head_bytes = soff + up64(static_cast<std::size_t>(KT) * vs_row_bytes());
    block_bytes = static_cast<std::size_t>(hkv) * head_bytes;
    const std::size_t bytes = static_cast<std::size_t>(ntiles) * block_bytes;
    if (bytes < kHugePage && huge_pages_on()) {
      // a short context: carved from the weight arena's huge chunks, so the caches of all layers share 2 MiB
      // pages; resident from the start (zeroed here), at most 2 MiB a layer
      auto [p, owner] = weight_arena().take(bytes);
      std::memset(p, 0, bytes);
      mem = std::shared_ptr<std::uint8_t>(owner, p);
    } else {
      mem = huge_zeroed(bytes);
    }
    if (rotated()) kmean.assign(static_cast<std::size_t>(hkv * d), 0.f);
  }
  bool allocated() const { return mem != nullptr; }
  char* head_block(i64 h, i64 tile) const {
    return reinterpret_cast<char*>(mem.get()) + static_cast<std::size_t>(tile) * block_bytes +
           static_cast<std::size_t>(h) * head_bytes;
  }
  // K tile `tile` of head h; V row `pos` of head h (the rows of one tile are contiguous, the next tile's are not)
  const void* ktile(i64 h, i64 tile) const { return head_block(h, tile); }
  const void* vrow(i64 h, i64 pos) const {
    return head_block(h, pos / KT) + voff + static_cast<std::size_t>(pos % KT) * vrow_bytes();
  }
  void* vscale_bytes(i64 h, i64 pos) const {
    return scale_bytes() ? head_block(h, pos / KT) + soff + static_cast<std::size_t>(pos % KT) * vs_row_bytes()
                         : nullptr;
  }
  float* vscale(i64 h, i64 pos) const { return static_cast<float*>(vscale_bytes(h, pos)); }  // q8
  // bytes an export puts before a head's K tiles (q4r / q3r: its kmean)
  std::size_t khead_bytes() const { return rotated() ? static_cast<std::size_t>(d) * 4 : 0; }
};

// One row x[0:n] as q8 (hetero.ops.llm.kv_q8_round): per block of KVB, d = amax/127 and
// q = clamp(round_half_even(x * 127/amax), -127, 127); q[i] goes to q8[i * stride], the block scales to sc[b * sstride].
void kv_quantize_row(const float* x, i64 n, std::int8_t* q8, i64 stride, float* sc, i64 sstride) {
  for (i64 b = 0; b * KVB < n; ++b) {
    const i64 lo = b * KVB, hi = std::min<i64>(n, lo + KVB);
    float amax = 0.f;
    for (i64 i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (i64 i = lo; i < hi; ++i) {
      const float r = std::nearbyint(x[i] * inv);
      q8[i * stride] = static_cast<std::int8_t>(std::min(127.f, std::max(-127.f, r)));
    }
    sc[b * sstride] = amax / 127.f;
  }
}

// One position's rotated low-bit K and V rows (q4r / q3r): each rotated and quantized (kvq::quantize_row); K's
// codes go to the tile's rows at `lane`, its scales to the tile's scale block, V's codes packed into its row.
void rotated_append(const Attention& at, i64 h, const float* ks, const float* vs, char* kt, char* vr, i64 lane,
                    void* vscales) {
  const i64 D = at.d, nb = at.nb();
  const int bits = at.bits();
  float* tmp = tl_f(0).get(static_cast<std::size_t>(3 * D));
  float* centred = tmp + D;
  auto* codes = reinterpret_cast<std::uint8_t*>(tmp + 2 * D);  // D bytes within the last D floats
  std::uint16_t sc[64];  // nb <= 64: head_dim <= 2048
  const float* mu = at.kmean.data() + h * D;
  for (i64 i = 0; i < D; ++i) centred[i] = ks[i] - mu[i];
  kvq::quantize_row(centred, D, bits, tmp, codes, sc);
  auto* kb = reinterpret_cast<std::uint8_t*>(kt);
  const std::size_t rb = at.krow_bytes();
  for (i64 i = 0; i < D; ++i) kvq::set_code(kb + static_cast<std::size_t>(i) * rb, bits, lane, codes[i]);
  auto* ksc = reinterpret_cast<std::uint16_t*>(kb + static_cast<std::size_t>(D) * rb);
  for (i64 b = 0; b < nb; ++b) ksc[b * KT + lane] = sc[b];
  kvq::quantize_row(vs, D, bits, tmp, codes, static_cast<std::uint16_t*>(vscales));
  auto* vb = reinterpret_cast<std::uint8_t*>(vr);
  for (i64 i = 0; i < D; ++i) kvq::set_code(vb, bits, i, codes[i]);
}

// Keys and values of tile l0 of kv head h decoded to float (q4r / q3r; still rotated): kf [d][KT] (the tile's 64
// positions), vf [nv][d] (its first nv rows). sf: nb * KT floats of scratch.
void rotated_tile(const Attention& at, kvq::DecodeFn decode, i64 h, i64 l0, i64 nv, float* kf, float* vf, float* sf) {
  const LlmKernels& kr = lk();
  const i64 D = at.d, nb = at.nb();
  const int bits = at.bits();
  const auto* kb = static_cast<const std::uint8_t*>(at.ktile(h, l0 / KT));
  const std::size_t rb = at.krow_bytes();
  // K: the scales [nb][KT], then one call per 32 rows (64 blocks sharing one row of scales); V: the nv rows' scales
  // and codes are contiguous, one call each
  kr.f16_to_f32(reinterpret_cast<const std::uint16_t*>(kb + static_cast<std::size_t>(D) * rb), sf, nb * KT);
  for (i64 i = 0; i < D; i += KVB)
    decode(bits, kb + static_cast<std::size_t>(i) * rb, 2 * KVB, sf + (i / KVB) * KT, 2, kf + i * KT);
  kr.f16_to_f32(static_cast<const std::uint16_t*>(at.vscale_bytes(h, l0)), sf, nv * nb);
  decode(bits, static_cast<const std::uint8_t*>(at.vrow(h, l0)), nv * nb, sf, 0, vf);
}

// The keys and values of kv head h of a run of T rows at `past` appended to a float16 / float32 / q8 cache (not the
// rotated kinds): the head's K tile columns and V rows, which no other head's append touches.
void append_head(Attention& at, i64 h, const float* kin, const float* vin, i64 T, i64 past) {
  const LlmKernels& kr = lk();
  const i64 hkv = at.hkv, D = at.d;
  std::uint16_t* hbuf = reinterpret_cast<std::uint16_t*>(tl_f(0).get(static_cast<std::size_t>(3 * D)));
  for (i64 t = 0; t < T; ++t) {
    const i64 pos = past + t;
    const float* ks = kin + (t * hkv + h) * D;
    const float* vs = vin + (t * hkv + h) * D;
    char* kt = static_cast<char*>(const_cast<void*>(at.ktile(h, pos / KT)));
    char* vr = static_cast<char*>(const_cast<void*>(at.vrow(h, pos)));
    const i64 lane = pos % KT;
    if (at.kind == KV_Q8) {
      auto* kd = reinterpret_cast<std::int8_t*>(kt);
      kv_quantize_row(ks, D, kd + lane, KT, reinterpret_cast<float*>(kd + D * KT) + lane, KT);
      kv_quantize_row(vs, D, reinterpret_cast<std::int8_t*>(vr), 1, at.vscale(h, pos), 1);
    } else if (at.kind == KV_F16) {
      kr.f32_to_f16(ks, hbuf, D);
      auto* kd = reinterpret_cast<std::uint16_t*>(kt);
      for (i64 i = 0; i < D; ++i) kd[i * KT + lane] = hbuf[i];
      kr.f32_to_f16(vs, reinterpret_cast<std::uint16_t*>(vr), D);
    } else {
      auto* kd = reinterpret_cast<float*>(kt);
      for (i64 i = 0; i < D; ++i) kd[i * KT + lane] = ks[i];
      std::memcpy(vr, vs, static_cast<std::size_t>(D) * 4);
    }
  }
}

bool kv_touch_on() {
  static const bool on = [] { const char* e = std::getenv("HETERO_LLM_KVTOUCH"); return !e || std::atoi(e) != 0; }();
  return on;
}

// The lines of kv head h that a decode step's attention over positions [0, n) reads, as KvAhead ranges: per K tile,
// the tile and its first rows of V (one run: they are adjacent in the head's part of a block).
KvAhead kv_ahead_of(const Attention& at, i64 h, i64 n) {
  KvAhead a;
  const i64 tiles = (n + KT - 1) / KT;
  const auto run = [&](i64 rows) { return at.voff + static_cast<std::size_t>(rows) * at.vrow_bytes(); };
  a.base = at.head_block(h, 0);
  a.cur = a.base;
  a.end = a.base + run(std::min<i64>(KT, n));
  a.stride = at.block_bytes;
  a.len = run(KT);
  a.last = run(n - (tiles - 1) * KT);
  a.runs = tiles - 1;
  return a;
}

// Loads one word of every line kv head h's attention over positions [0, n) reads (its K tiles, the first n V rows,
// q8's V scales), back to back, before the step's append and the kernels. A decode step finds its layer's cache
// cold (~10 MB of weights streamed since the last step's visit): a run of independent loads brings it in sooner
// than the kernels' own loads do, interleaved with their arithmetic, and the append's scattered stores (a K tile
// is transposed: one position's key touches d lines) then hit lines already in cache. A burst of software
// prefetches of the same lines (into L1 or L2, at the task's start or for every head before the tasks) measured no
// gain; spaced through the kernels' loops they do (KvAhead: the next head's lines; docs/llm-benchmarks.md, dec16).
// Not for the rotated kinds (their tiles are decoded first) or prefill (its tiles are reused from L1).
void touch_head(const Attention& at, i64 h, i64 n) {
  std::uint64_t acc = 0;
  const auto lines = [&acc](const char* p, std::size_t bytes) {
    for (std::size_t o = 0; o < bytes; o += 64) acc += *reinterpret_cast<const std::uint64_t*>(p + o);
  };
  for (i64 l0 = 0; l0 < n; l0 += KT) {
    const char* b = at.head_block(h, l0 / KT);
    const std::size_t rows = static_cast<std::size_t>(std::min<i64>(KT, n - l0));
    lines(b, at.voff + rows * at.vrow_bytes());  // the K tile (and its scales), then the V rows
    if (at.scale_bytes()) lines(b + at.soff, rows * at.vs_row_bytes());
  }
  asm volatile("" : : "r"(acc));  // keeps the loads
}

// 1. of a run of T rows at `past`: its keys and values appended to the cache (the cache's filled count moves on).
void attention_append(Attention& at, const float* kin, const float* vin, i64 T, i64 past) {
  const i64 hkv = at.hkv, D = at.d;
  if (!at.rotated()) {
    for (i64 h = 0; h < hkv; ++h) append_head(at, h, kin, vin, T, past);
  } else {
    if (past == 0) {  // a new sequence: the keys' centre is the mean of its first keys, per kv head
      const i64 n = std::min<i64>(T, kvq::kMeanPositions);
      for (i64 h = 0; h < hkv; ++h)
        for (i64 i = 0; i < D; ++i) {
          double sum = 0.0;
          for (i64 t = 0; t < n; ++t) sum += static_cast<double>(kin[(t * hkv + h) * D + i]);
          at.kmean[static_cast<std::size_t>(h * D + i)] = static_cast<float>(sum / static_cast<double>(n));
        }
    }
    // rotation + codebook search per row: one task per kv head (heads share no byte)
    const double rows_work = static_cast<double>(T) * static_cast<double>(hkv) * static_cast<double>(D) * 32.0;
    parallel_for(hkv, threads_for(rows_work, 32768.0), [&](i64 h) {
      tl_f(0).get(static_cast<std::size_t>(3 * D));  // rotated_append's scratch
      for (i64 t = 0; t < T; ++t) {
        const i64 pos = past + t;
        char* kt = static_cast<char*>(const_cast<void*>(at.ktile(h, pos / KT)));
        char* vr = static_cast<char*>(const_cast<void*>(at.vrow(h, pos)));
        rotated_append(at, h, kin + (t * hkv + h) * D, vin + (t * hkv + h) * D, kt, vr, pos % KT,
                       at.vscale_bytes(h, pos));
      }
    });
  }
  at.filled = past + T;
}

// 2. of a run: rows r = t * group + g of kv head h (ascending positions), blocks of RB rows per task; online softmax
// over the key tiles, which every quad of rows of the block reuses from L1. plan() sizes the tasks (and decodes a
// q4r / q3r prefill's tiles up front), task(i) computes one; a step of several sequences runs every run's tasks in
// one parallel loop (py_attention_runs), a run alone in its own (attention_run). A task's rows get the same
// operations whichever thread runs it, so the outputs are the same either way.
struct AttentionRun {
  Attention* at;
  const float* q;
  i64 T, hq, past;
  float scale;
  float* out;
  i64 group = 0, rows = 0, nblk = 0, used = 0;
  std::size_t tile_f = 0;
  bool shared = false;  // q4r / q3r tiles decoded up front into `dec` (thread-local to the planning thread)
  float* dec = nullptr;
  kvq::DecodeFn decode = nullptr;

  i64 tasks() const { return at->hkv * nblk; }
  double work() const {
    return static_cast<double>(rows) * static_cast<double>(past + T) * static_cast<double>(at->d) * at->hkv;
  }
  i64 blocks() const { return (T * (hq / at->hkv) + RB - 1) / RB; }  // row blocks per kv head
  i64 tiles() const { return (past + T + KT - 1) / KT; }              // K tiles the rows see
  // Whether plan() decodes tiles into the planning thread's buffer (then the run's tasks must run before the next
  // run is planned).
  bool decodes_up_front() const {
    return at->rotated() && blocks() > 1 &&
           static_cast<std::size_t>(at->hkv * tiles()) * static_cast<std::size_t>(2 * at->d * KT) * 4 <= (32u << 20);
  }

  void plan() {
    const Attention& a = *at;
    const i64 hkv = a.hkv, D = a.d;
    group = hq / hkv;
    rows = T * group;
    nblk = blocks();
    decode = kvq::decoder();
    // q4r / q3r with several row blocks per head (prefill): every tile decoded once, up front, into a shared
    // buffer (bounded: 32 MiB), instead of once per block of RB rows
    used = tiles();
    tile_f = static_cast<std::size_t>(2 * D * KT);  // K [D][KT] then V [KT][D]
    shared = decodes_up_front();
    thread_local Scratch<float> decoded;
    dec = shared ? decoded.get(static_cast<std::size_t>(hkv * used) * tile_f) : nullptr;
    if (shared) {
      parallel_for(hkv * used, threads_for(static_cast<double>(hkv * used) * static_cast<double>(tile_f), 32768.0),
                   [&](i64 job) {
                     const i64 h = job / used, l0 = (job % used) * KT;
                     float* kf = dec + static_cast<std::size_t>(job) * tile_f;
                     float* sf = tl_f(4).get(static_cast<std::size_t>(a.nb() * KT));
                     rotated_tile(a, decode, h, l0, std::min<i64>(KT, past + T - l0), kf, kf + D * KT, sf);
                   });
    }
  }

  // ahead (or nullptr): lines the kernels prefetch while they compute (KvAhead; a decode step's next head).
  void task(i64 task, KvAhead* ahead = nullptr) const {
    const LlmKernels& kr = lk();
    const Kernels& base = active();
    const Attention& at = *this->at;
    const i64 D = at.d;
    const i64 h = task / nblk, r0 = (task % nblk) * RB, r1 = std::min(rows, r0 + RB);
    const i64 nr_all = r1 - r0;
    float* qb = tl_f(1).get(static_cast<std::size_t>(RB * D));
    float* ob = tl_f(2).get(static_cast<std::size_t>(RB * D));
    float* sb = tl_f(3).get(static_cast<std::size_t>(4 * KT));
    float mx[RB], sum[RB], corr[4];
    i64 limit[RB];
    const bool rot = at.rotated();
    for (i64 i = 0; i < nr_all; ++i) {
      const i64 r = r0 + i, t = r / group, g = r % group;
      std::memcpy(qb + i * D, q + (t * hq + h * group + g) * D, static_cast<std::size_t>(D) * 4);
      if (rot) kvq::rotate(qb + i * D, D);  // q . k = rot(q) . rot(k): the keys stay rotated
      limit[i] = past + t;
      mx[i] = -std::numeric_limits<float>::infinity();
      sum[i] = 0.f;
    }
    // q4r / q3r: each tile's keys and values decoded once into L1 scratch, then read as a float32 tile
    float* kf = rot ? tl_f(4).get(static_cast<std::size_t>((2 * D + at.nb()) * KT)) : nullptr;
    float* vf = rot ? kf + D * KT : nullptr;
    float* sf = rot ? vf + D * KT : nullptr;
    const int tkind = rot ? KV_F32 : at.kind;
    std::memset(ob, 0, static_cast<std::size_t>(nr_all * D) * 4);
    const i64 last = limit[nr_all - 1];
    for (i64 l0 = 0; l0 <= last; l0 += KT) {
      const void* kt = at.ktile(h, l0 / KT);
      const void* vt = at.vrow(h, l0);
      const float* vst = at.kind == KV_Q8 ? at.vscale(h, l0) : nullptr;
      if (shared) {
        const float* tile = dec + static_cast<std::size_t>(h * used + l0 / KT) * tile_f;
        kt = tile;
        vt = tile + D * KT;
      } else if (rot) {
        rotated_tile(at, decode, h, l0, std::min<i64>(KT, last + 1 - l0), kf, vf, sf);
        kt = kf;
        vt = vf;
      }
      for (i64 i0 = 0; i0 < nr_all; i0 += 4) {
        const int nr = static_cast<int>(std::min<i64>(4, nr_all - i0));
        if (limit[i0 + nr - 1] < l0) continue;  // every row of this quad comes before the tile (rows ascend: its
                                                // last row sees the most; its first one skipped a quad straddling
                                                // the tile's start, whose last rows then missed the tile's keys)
        const i64 qk = std::min<i64>(KT, limit[i0 + nr - 1] + 1 - l0);  // positions any row of the quad sees
        kr.qk_tile(qb + i0 * D, D, nr, kt, tkind, D, scale, sb, KT, ahead);
        for (int r = 0; r < nr; ++r) {
          float* sr = sb + r * KT;
          // a row before the tile (the quad's first rows, when the quad straddles a tile start) sees none of it:
          // 0, not negative (the zeroing below started before its scores, writing out of sb)
          const i64 vis = std::max<i64>(0, std::min(qk, limit[i0 + r] + 1 - l0));
          float m = mx[i0 + r];
          for (i64 l = 0; l < vis; ++l) m = std::max(m, sr[l]);
          for (i64 l = 0; l < vis; ++l) sr[l] -= m;
          base.unary(U_EXP, sr, sr, vis, 0.f, 0.f);
          for (i64 l = vis; l < qk; ++l) sr[l] = 0.f;
          float ps = 0.f;
          for (i64 l = 0; l < vis; ++l) ps += sr[l];
          corr[r] = std::exp(mx[i0 + r] - m);
          sum[i0 + r] = sum[i0 + r] * corr[r] + ps;
          mx[i0 + r] = m;
        }
        kr.pv_tile(sb, KT, nr, vt, tkind, vst, qk, D, corr, ob + i0 * D, ahead);
      }
    }
    for (i64 i = 0; i < nr_all; ++i) {
      const i64 r = r0 + i, t = r / group, g = r % group;
      float* o = out + (t * hq + h * group + g) * D;
      if (rot) kvq::unrotate(ob + i * D, D);  // the weighted sum of rotated values, back once per row
      const float inv = 1.f / sum[i];
      for (i64 j = 0; j < D; ++j) o[j] = ob[i * D + j] * inv;
    }
  }
};

void attention_run(Attention& at, const float* q, const float* kin, const float* vin, i64 T, i64 hq, i64 past,
                   float scale, float* out) {
  AttentionRun run{&at, q, T, hq, past, scale, out};
  if (!at.rotated() && run.blocks() == 1) {
    // One block of rows per kv head (a decode step): the task of head h (or of a run of heads, with the read-ahead
    // below) appends its keys and values, then computes its rows, so when the attention runs on several threads
    // the append does too. The thread count is the
    // attention's own: a context too short for it stays on the caller (a region more per layer cost more than it
    // saved on a shared machine, where each region may wait on a descheduled worker).
    run.plan();
    const int nt = threads_for(run.work(), 32768.0);
    if (!kv_touch_on()) {
      parallel_for(run.tasks(), nt, [&](i64 h) {
        append_head(at, h, kin, vin, T, past);
        run.task(h);
      });
      at.filled = past + T;
      return;
    }
    // The read-ahead: a task takes a run of consecutive heads; its first head's lines are read by touch_head, each
    // next head's prefetched by the kernels while they compute the one before (not for q8: its V scales are a
    // range of their own, so every head is touched).
    const i64 hkv = at.hkv, n = past + T;
    const i64 tasks = std::min<i64>(hkv, nt);  // nt <= the pool's threads (threads_for)
    const bool chain = at.scale_bytes() == 0;
    parallel_for(tasks, nt, [&](i64 t) {
      const i64 h0 = hkv * t / tasks, h1 = hkv * (t + 1) / tasks;
      for (i64 h = h0; h < h1; ++h) {
        if (h == h0 || !chain) touch_head(at, h, n);  // first: the append's stores then find their lines in cache
        append_head(at, h, kin, vin, T, past);
        KvAhead next = chain && h + 1 < h1 ? kv_ahead_of(at, h + 1, n) : KvAhead{};
        run.task(h, chain && h + 1 < h1 ? &next : nullptr);
      }
    });
    at.filled = past + T;
    return;
  }
  attention_append(at, kin, vin, T, past);
  run.plan();
  parallel_for(run.tasks(), threads_for(run.work(), 32768.0), [&](i64 t) { run.task(t); });
}

void attention_shapes(const Attention& at, const py::array& q, const py::array& k, const py::array& v,
                      const py::array& out, const char* fn) {
  need_f32c(q, fn, "q");
  need_f32c(k, fn, "k");
  need_f32c(v, fn, "v");
  need_out(out, fn);
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3) fail(std::string(fn) + ": q, k, v must be [T, heads, dim]");
  const i64 T = q.shape(0), hq = q.shape(1), D = q.shape(2);
  if (k.shape(0) != T || v.shape(0) != T || k.shape(1) != at.hkv || v.shape(1) != at.hkv || k.shape(2) != at.d ||
      v.shape(2) != at.d || D != at.d)
    fail(std::string(fn) + ": k/v must be [T, " + std::to_string(at.hkv) + ", " + std::to_string(at.d) + "]");
  if (hq % at.hkv) fail(std::string(fn) + ": query heads must be a multiple of kv heads");
  if (out.size() != T * hq * D) fail(std::string(fn) + ": out must be [T, heads * dim]");
}

void py_attention(Attention& at, const py::array& q, const py::array& k, const py::array& v, i64 past, float scale,
                  const py::array& out) {
  const char* fn = "llm_attention";
  attention_shapes(at, q, k, v, out, fn);
  const i64 T = q.shape(0), hq = q.shape(1);
  if (past < 0 || past > at.filled)
    fail("past_len " + std::to_string(past) + " is outside the " + std::to_string(at.filled) + " cached positions");
  if (past + T > at.max_ctx)
    fail(std::to_string(past) + " cached + " + std::to_string(T) + " new tokens exceed the context of " +
         std::to_string(at.max_ctx) + " tokens");
  if (T == 0) return;
  if (!at.allocated()) at.alloc();
  const float* pq = cfptr(q);
  const float* pk = cfptr(k);
  const float* pv = cfptr(v);
  float* po = fptr(out);
  py::gil_scoped_release nogil;
  attention_run(at, pq, pk, pv, T, hq, past, scale, po);
}

// py_attention at the past_len the array holds when it runs; the check is py_attention's range check (the cache's
// own filled count: only this op writes its cache).
StepOp prep_attention_at(Attention& at, const py::array& q, const py::array& k, const py::array& v,
                         const py::array& past, float scale, const py::array& out) {
  const char* fn = "llm_attention";
  attention_shapes(at, q, k, v, out, fn);
  const std::int64_t* pp = past_ptr(past, fn);
  const i64 T = q.shape(0), hq = q.shape(1);
  Attention* ap = &at;
  const float* pq = cfptr(q);
  const float* pk = cfptr(k);
  const float* pv = cfptr(v);
  float* po = fptr(out);
  return {[ap, pp, T] {
            const i64 p = *pp;
            if (p < 0 || p > ap->filled || p + T > ap->max_ctx) return false;
            if (T > 0 && !ap->allocated()) ap->alloc();
            return true;
          },
          [ap, pp, pq, pk, pv, po, T, hq, scale] {
            if (T > 0) attention_run(*ap, pq, pk, pv, T, hq, *pp, scale, po);
          }};
}

// A one-row step of a node serving several sequences (a lone stream's decode): its slot and position are
// one-element int64 arrays read when it runs, the slot choosing the cache — the one-sequence step on that cache.
StepOp prep_attention_slot_at(const py::list& caches, const py::array& q, const py::array& k, const py::array& v,
                              const py::array& past, const py::array& slot, float scale, const py::array& out) {
  const char* fn = "llm_attention";
  std::vector<Attention*> at;
  for (const auto& item : caches) at.push_back(&item.cast<Attention&>());
  if (at.empty()) fail(std::string(fn) + ": no caches");
  for (Attention* a : at) attention_shapes(*a, q, k, v, out, fn);
  if (q.shape(0) != 1) fail(std::string(fn) + ": a slot read at run time takes one row");
  const std::int64_t* pp = past_ptr(past, fn);
  const std::int64_t* ps = past_ptr(slot, fn);
  const i64 hq = q.shape(1);
  const float* pq = cfptr(q);
  const float* pk = cfptr(k);
  const float* pv = cfptr(v);
  float* po = fptr(out);
  return {[at, pp, ps] {
            const i64 c = *ps, p = *pp;
            if (c < 0 || c >= static_cast<i64>(at.size())) return false;
            Attention* ap = at[static_cast<std::size_t>(c)];
            if (p < 0 || p > ap->filled || p + 1 > ap->max_ctx) return false;
            if (!ap->allocated()) ap->alloc();
            return true;
          },
          [at, pp, ps, pq, pk, pv, po, hq, scale] {
            attention_run(*at[static_cast<std::size_t>(*ps)], pq, pk, pv, 1, hq, *pp, scale, po);
          }};
}

// A step of several sequences in one call (hetero.llm.batch): runs int64 [R, 4] of (cache index, first row, end row,
// position) — rows [a, b) of q / k / v are the one-sequence step of caches[index] at that position. Each run is
// attention_run on its own cache, as a call per run would do it, with one GIL release for all; the caller (the
// Attention kernel) checked each run against its cache's filled positions and the context.
void py_attention_runs(const py::list& caches, const py::array& q, const py::array& k, const py::array& v,
                       const py::array& runs, float scale, const py::array& out) {
  const char* fn = "llm_attention_runs";
  need_f32c(q, fn, "q");
  need_f32c(k, fn, "k");
  need_f32c(v, fn, "v");
  need_out(out, fn);
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3) fail(std::string(fn) + ": q, k, v must be [T, heads, dim]");
  if (!has_type<std::int64_t>(runs) || !is_c(runs) || runs.ndim() != 2 || runs.shape(1) != 4)
    fail(std::string(fn) + ": runs must be int64 [R, 4] (cache, start, end, position)");
  std::vector<Attention*> at;
  for (const auto& item : caches) at.push_back(&item.cast<Attention&>());
  if (at.empty()) fail(std::string(fn) + ": no caches");
  const i64 T = q.shape(0), hq = q.shape(1), D = q.shape(2), hkv = at[0]->hkv;
  for (const Attention* a : at)
    if (a->hkv != hkv || a->d != D) fail(std::string(fn) + ": the caches differ from q / k / v in heads or head size");
  if (k.shape(0) != T || v.shape(0) != T || k.shape(1) != hkv || v.shape(1) != hkv || k.shape(2) != D ||
      v.shape(2) != D)
    fail(std::string(fn) + ": k/v must be [T, " + std::to_string(hkv) + ", " + std::to_string(D) + "]");
  if (hq % hkv) fail(std::string(fn) + ": query heads must be a multiple of kv heads");
  if (out.size() != T * hq * D) fail(std::string(fn) + ": out must be [T, heads * dim]");
  const i64 R = runs.shape(0);
  const auto* r = static_cast<const std::int64_t*>(runs.data());
  std::vector<i64> filled;
  for (const Attention* a : at) filled.push_back(a->filled);
  for (i64 i = 0; i < R; ++i) {  // the same checks as py_attention's, in run order (a slot may have two runs)
    const i64 c = r[i * 4], a = r[i * 4 + 1], b = r[i * 4 + 2], past = r[i * 4 + 3];
    if (c < 0 || c >= static_cast<i64>(at.size()) || a < 0 || b <= a || b > T)
      fail(std::string(fn) + ": run " + std::to_string(i) + " is outside the rows or the caches");
    if (past < 0 || past > filled[static_cast<std::size_t>(c)] || past + (b - a) > at[static_cast<std::size_t>(c)]->max_ctx)
      fail(std::string(fn) + ": run " + std::to_string(i) + " at position " + std::to_string(past) +
           " does not follow its cache's " + std::to_string(filled[static_cast<std::size_t>(c)]) + " positions");
    filled[static_cast<std::size_t>(c)] = past + (b - a);
  }
  for (Attention* a : at)
    if (!a->allocated()) a->alloc();
  const float* pq = cfptr(q);
  const float* pk = cfptr(k);
  const float* pv = cfptr(v);
  float* po = fptr(out);
  py::gil_scoped_release nogil;
  std::vector<AttentionRun> plan;
  bool apart = false;  // a run that decodes its tiles up front: each run in its own loop, in order
  for (i64 i = 0; i < R; ++i) {
    const i64 c = r[i * 4], a = r[i * 4 + 1], b = r[i * 4 + 2], past = r[i * 4 + 3];
    plan.push_back({at[static_cast<std::size_t>(c)], pq + a * hq * D, b - a, hq, past, scale, po + a * hq * D});
    apart = apart || plan.back().decodes_up_front();
  }
  if (apart) {
    for (i64 i = 0; i < R; ++i) {
      const i64 a = r[i * 4 + 1];
      const AttentionRun& p = plan[static_cast<std::size_t>(i)];
      attention_run(*p.at, p.q, pk + a * hkv * D, pv + a * hkv * D, p.T, hq, p.past, scale, p.out);
    }
    return;
  }
  // Every run's keys and values appended first (in run order: a slot's second run follows its first), then all
  // their tasks in one parallel loop. A run reads only positions up to its own rows', so a later run's appended
  // positions do not change it.
  std::vector<i64> first(static_cast<std::size_t>(R) + 1, 0);
  double work = 0.0;
  for (i64 i = 0; i < R; ++i) {
    AttentionRun& p = plan[static_cast<std::size_t>(i)];
    const i64 a = r[i * 4 + 1];
    attention_append(*p.at, pk + a * hkv * D, pv + a * hkv * D, p.T, p.past);
    p.plan();
    first[static_cast<std::size_t>(i) + 1] = first[static_cast<std::size_t>(i)] + p.tasks();
    work += p.work();
  }
  parallel_for(first.back(), threads_for(work, 32768.0), [&](i64 t) {
    const auto i = static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), t) - first.begin() - 1);
    plan[i].task(t - first[i]);
  });
}

// The parts of kv head h's first n positions, tile by tile, as f(part, cache bytes, offset in the export's part,
// bytes): part 0 the K tiles (back to back in an export), 1 the V rows, 2 (q8 / q4r / q3r) the V scales.
template <class F>
void export_parts(const Attention& at, i64 h, i64 n, F&& f) {
  const std::size_t tb = at.tile_bytes(), vb = at.vrow_bytes(), sb = at.vs_row_bytes();
  for (i64 t = 0; t * KT < n; ++t) {
    const auto rows = static_cast<std::size_t>(std::min<i64>(KT, n - t * KT)), first = static_cast<std::size_t>(t * KT);
    f(0, const_cast<void*>(at.ktile(h, t)), static_cast<std::size_t>(t) * tb, tb);
    f(1, const_cast<void*>(at.vrow(h, t * KT)), first * vb, rows * vb);
    if (sb) f(2, at.vscale_bytes(h, t * KT), first * sb, rows * sb);
  }
}

// A prefix of the cache as bytes in its own layout, per kv head (rows): the K tiles covering positions [0, n) (q4r /
// q3r: after the head's kmean, d float32), V's rows [0, n), and (q8 / q4r / q3r) V's scales. `load` puts them back
// into a cache of the same heads, head size and type (a prefix cache: one sequence's computed prompt reused by
// another). A K tile's positions past n are copied as they are: the kernel never reads a position past `filled`.
py::tuple py_attention_export(const Attention& at, i64 n) {
  if (n < 0 || n > at.filled)
    fail("LlmAttention.export: " + std::to_string(n) + " positions; the cache holds " + std::to_string(at.filled));
  const i64 tiles = (n + KT - 1) / KT;
  const auto kbytes = static_cast<py::ssize_t>(tiles * static_cast<i64>(at.tile_bytes()));
  const auto kh = static_cast<py::ssize_t>(at.khead_bytes());
  const auto vbytes = static_cast<py::ssize_t>(n * static_cast<i64>(at.vrow_bytes()));
  const auto sbytes = static_cast<py::ssize_t>(n * static_cast<i64>(at.vs_row_bytes()));
  py::array_t<std::uint8_t> k({static_cast<py::ssize_t>(at.hkv), kh + kbytes});
  py::array_t<std::uint8_t> v({static_cast<py::ssize_t>(at.hkv), vbytes});
  py::array_t<std::uint8_t> s({static_cast<py::ssize_t>(at.hkv), sbytes});
  if (kh && !(n > 0 && at.allocated())) std::memset(k.mutable_data(), 0, static_cast<std::size_t>(k.nbytes()));
  if (n > 0 && at.allocated()) {
    for (i64 h = 0; h < at.hkv; ++h) {
      if (kh) std::memcpy(k.mutable_data(h, 0), at.kmean.data() + h * at.d, static_cast<std::size_t>(kh));
      std::uint8_t* parts[3] = {k.mutable_data(h, kh), v.mutable_data(h, 0), sbytes ? s.mutable_data(h, 0) : nullptr};
      export_parts(at, h, n, [&](int part, void* cache, std::size_t at_byte, std::size_t bytes) {
        std::memcpy(parts[part] + at_byte, cache, bytes);
      });
    }
  }
  return py::make_tuple(k, v, s);
}

void py_attention_load(Attention& at, i64 n, const py::array_t<std::uint8_t, py::array::c_style>& k,
                       const py::array_t<std::uint8_t, py::array::c_style>& v,
                       const py::array_t<std::uint8_t, py::array::c_style>& s) {
  if (n < 0 || n > at.max_ctx)
    fail("LlmAttention.load: " + std::to_string(n) + " positions; the context holds " + std::to_string(at.max_ctx));
  const i64 tiles = (n + KT - 1) / KT;
  const i64 kh = static_cast<i64>(at.khead_bytes());
  const i64 kbytes = tiles * static_cast<i64>(at.tile_bytes()), vbytes = n * static_cast<i64>(at.vrow_bytes());
  const i64 sbytes = n * static_cast<i64>(at.vs_row_bytes());
  // an export of at least n positions: its first n are loaded
  auto shaped = [&](const py::array& a, i64 bytes) { return a.ndim() == 2 && a.shape(0) == at.hkv && a.shape(1) >= bytes; };
  if (!shaped(k, kh + kbytes) || !shaped(v, vbytes) || !shaped(s, sbytes))
    fail("LlmAttention.load: the arrays are not an export of " + std::to_string(n) + "+ positions of a cache with " +
         std::to_string(at.hkv) + " kv heads of " + std::to_string(at.d) + " values in this type");
  if (!at.allocated()) at.alloc();
  for (i64 h = 0; h < at.hkv && n > 0; ++h) {
    if (kh) std::memcpy(at.kmean.data() + h * at.d, k.data(h, 0), static_cast<std::size_t>(kh));
    const std::uint8_t* parts[3] = {k.data(h, kh), v.data(h, 0), sbytes ? s.data(h, 0) : nullptr};
    export_parts(at, h, n, [&](int part, void* cache, std::size_t at_byte, std::size_t bytes) {
      std::memcpy(cache, parts[part] + at_byte, bytes);
    });
  }
  at.filled = n;
}

// rms_norm (module.cpp) on contiguous rows: the same row kernel through the same driver.
Op prep_rms_norm(const py::array& x, const py::array& scale, const py::array& out, float eps) {
  const char* fn = "rms_norm";
  need_f32c(x, fn, "x");
  need_f32c(scale, fn, "scale");
  need_out(out, fn);
  if (x.ndim() != 2 || scale.ndim() != 1 || scale.shape(0) != x.shape(1) || out.size() != x.size())
    fail(std::string(fn) + ": x must be (rows, n), scale (n,), out rows x n floats");
  const i64 rows = x.shape(0), n = x.shape(1);
  const char* px = static_cast<const char*>(x.data());
  const float* ps = cfptr(scale);
  float* po = fptr(out);
  return [px, ps, po, rows, n, eps] {
    rows_nd(active(), RowOp::RmsNorm, px, rows, n, n * 4, 4, po, ps, nullptr, eps, nullptr, nullptr, false);
  };
}

// ------------------------------------------------------------------------------------------------ step programs
// A run of a replay's consecutive calls as one native call (hetero_cpu.fuse): each added op is the call it
// replaces, prepared once; a call checks every op first (under the GIL), then runs them in order with the GIL
// released once. If a check refuses (past_len out of range: the unfused call would raise), nothing has run and
// the unfused calls run instead, so the error is theirs.
// With `timing` on (benchmarks/decode_threads.py --per-op), each op's wall time and the pool's account of it
// (pool_stats, read and reset after each op) are summed per op: the split of the step as it runs, back to back.
struct LlmStep {
  std::vector<StepOp> ops;
  std::vector<py::object> keep;  // every argument an op points into
  std::vector<bsplit::Plan> plans;  // per op: the weights it streams (empty: none)
  std::vector<const bsplit::Plan*> next;  // per op: the plan of the next op that streams weights (or nullptr)
  py::list fallback;             // the unfused calls, in order
  bool timing = false;
  bool timing_cpu = false;  // times in the process's CPU time instead of wall time
  // With timing (wall): also keep each op's wall times of the runs during which every pool thread ran throughout
  // (its own CPU clock advanced by the wall interval: none preempted or asleep), what a quiet machine would see
  bool timing_clean = false;
  std::vector<std::pair<std::int64_t, PoolStats>> times;  // per op: ns, pool statistics (timing on)
  std::vector<std::vector<std::int64_t>> clean;  // per op: wall ns of its clean runs (timing_clean)
  std::vector<PoolStats> clean_stats;             // per op: the pool's account of its clean runs

  void add(StepOp op, py::object args, bsplit::Plan plan = {}) {
    ops.push_back(std::move(op));
    keep.push_back(std::move(args));
    plans.push_back(std::move(plan));
    next.assign(ops.size(), nullptr);
    for (std::size_t i = ops.size() - 1; i > 0; --i)
      next[i - 1] = plans[i].empty() ? next[i] : &plans[i];
  }
  // Runs op i with tl_next set (the split's prefetch of the next weights).
  void run_op(std::size_t i) {
    bsplit::tl_next = next[i];
    ops[i].run();
  }
  bool operator()() {
    for (StepOp& o : ops)
      if (o.check && !o.check()) {
        for (const py::handle c : fallback) c();
        return false;
      }
    py::gil_scoped_release nogil;
    struct Reset {
      ~Reset() { bsplit::tl_next = nullptr; }
    } reset;
    if (!timing) {
      for (std::size_t i = 0; i < ops.size(); ++i) run_op(i);
      return true;
    }
    times.resize(ops.size());
    pool_stats(true);
    const auto clk = [cpu = timing_cpu]() -> std::int64_t {
      // the process's CPU time (all threads): a neighbour taking the core away does not count; another thread's
      // running time is added at scheduler ticks, so per op this is exact at 1 thread only
      if (cpu) {
        timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
      }
      return std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    if (timing_clean && !timing_cpu) {
      clean.resize(ops.size());
      clean_stats.resize(ops.size());
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const std::vector<std::int64_t> c0 = pool_cpu_ns();
        const auto t0 = clk();
        run_op(i);
        const auto t1 = clk();
        const std::vector<std::int64_t> c1 = pool_cpu_ns();
        const PoolStats st = pool_stats(true);
        times[i].first += t1 - t0;
        times[i].second += st;
        // and a pooled op's regions each joined by a worker (one running but not yet back in the pool's spin,
        // e.g. still on its way out of a futex wait, can advance its clock without taking part)
        bool ran = c0.size() == c1.size() && st.joins >= st.calls;
        // 2 us of slack for the clocks' own reads and resolution; a preemption or a sleep is far longer
        for (std::size_t k = 0; ran && k < c0.size(); ++k)
          ran = c0[k] >= 0 && c1[k] >= 0 && c1[k] - c0[k] >= t1 - t0 - 2000;
        if (ran) {
          clean[i].push_back(t1 - t0);
          clean_stats[i] += st;
        }
      }
      return true;
    }
    auto t0 = clk();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      run_op(i);
      const auto t1 = clk();
      times[i].first += t1 - t0;
      times[i].second += pool_stats(true);
      t0 = t1;
    }
    return true;
  }
  py::list take_times() {  // [(seconds, pool_stats dict)] per op since the last call; resets
    py::list out;
    for (const auto& t : times)
      out.append(py::make_tuple(static_cast<double>(t.first) * 1e-9, pool_stats_dict(t.second)));
    times.assign(times.size(), {});
    return out;
  }
  // [([seconds of each clean run], pool_stats dict of those runs)] per op since the last call; resets
  py::list take_clean() {
    py::list out;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      py::list runs;
      if (i < clean.size())
        for (const std::int64_t ns : clean[i]) runs.append(static_cast<double>(ns) * 1e-9);
      out.append(py::make_tuple(runs, pool_stats_dict(i < clean_stats.size() ? clean_stats[i] : PoolStats{})));
    }
    clean.assign(clean.size(), {});
    clean_stats.assign(clean_stats.size(), {});
    return out;
  }
};

// ------------------------------------------------------------------------------------------------ MoE
struct MoE {
  std::shared_ptr<Weights> gate, up, down;
  std::shared_ptr<Weights> sgate, sup, sdown;  // the shared expert (optional; one "expert" each)
  py::object router_keep, seg_keep;
  const float* router = nullptr;
  const float* seg = nullptr;                  // the shared expert's sigmoid gate [H] (optional)
  i64 E = 0, H = 0, I = 0, Is = 0;
  int top_k = 1;
  bool norm = true;
};

// y[n, H] = down_e(silu(gate_e(x)) * up_e(x)) for the n rows of x [n, H]; I = the expert's inner size.
void swiglu_expert(const Weights& gate, const Weights& up, const Weights& down, i64 e, const float* x, i64 n,
                   i64 H, i64 I, float* y) {
  const LlmKernels& kr = lk();
  float* gu = tl_f(6).get(static_cast<std::size_t>(2 * n * I));
  float* g = gu;
  float* u = gu + n * I;
  const bool share = gate.quant && up.quant && gate.pk.bs == up.pk.bs && gate.pk.nibbles() == up.pk.nibbles() &&
                     x_scale_block(kr, gate.pk) == x_scale_block(kr, up.pk);
  if (share) {  // gate and up read the same quantized activations
    XQ xq = tl_xq(0).make(kr, x, n, H, H, gate.pk, n >= 16);
    matmul_core(gate, e, x, n, H, &xq, g, I, nullptr);
    matmul_core(up, e, x, n, H, &xq, u, I, nullptr);
  } else {
    matmul(gate, e, x, n, H, g, I, nullptr, 0);
    matmul(up, e, x, n, H, u, I, nullptr, 0);
  }
  const Kernels& base = active();
  base.unary(U_SILU, g, g, n * I, 0.f, 0.f);
  base.binary(B_MUL, BM_VV, g, u, g, n * I);
  matmul(down, e, g, n, I, y, H, nullptr, 1);
}

void moe_run(const MoE& mo, const float* x, i64 T, float* out) {
  const i64 E = mo.E, H = mo.H, I = mo.I;
  const int K = mo.top_k;
  const LlmKernels& kr = lk();
  // 1. router logits [T, E] and top-k
  std::vector<float> logits(static_cast<std::size_t>(T * E));
  for (i64 m = 0; m < T; m += 4) {
    const int r = static_cast<int>(std::min<i64>(4, T - m));
    for (i64 e = 0; e < E; e += 4) {
      const int rows = static_cast<int>(std::min<i64>(4, E - e));
      float tmp[16];
      kr.fgemm_tile(W_F32, mo.router + e * H, H, rows, H, x + m * H, H, r, tmp, 4);
      for (int i = 0; i < r; ++i)
        for (int j = 0; j < rows; ++j) logits[static_cast<std::size_t>((m + i) * E + e + j)] = tmp[i * 4 + j];
    }
  }
  std::vector<i64> chosen(static_cast<std::size_t>(T * K));
  std::vector<float> cw(static_cast<std::size_t>(T * K));
  std::vector<double> p(static_cast<std::size_t>(E));
  std::vector<i64> order(static_cast<std::size_t>(E));
  for (i64 t = 0; t < T; ++t) {
    const float* lg = logits.data() + t * E;
    float mxv = lg[0];
    for (i64 e = 1; e < E; ++e) mxv = std::max(mxv, lg[e]);
    double tot = 0.0;
    for (i64 e = 0; e < E; ++e) {
      p[static_cast<std::size_t>(e)] = std::exp(static_cast<double>(lg[e] - mxv));
      tot += p[static_cast<std::size_t>(e)];
    }
    for (i64 e = 0; e < E; ++e) {
      p[static_cast<std::size_t>(e)] /= tot;
      order[static_cast<std::size_t>(e)] = e;
    }
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](i64 a, i64 b) {
      const double pa = p[static_cast<std::size_t>(a)], pb = p[static_cast<std::size_t>(b)];
      return pa > pb || (pa == pb && a < b);
    });
    double ws = 0.0;
    for (int j = 0; j < K; ++j) ws += p[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
    for (int j = 0; j < K; ++j) {
      const i64 e = order[static_cast<std::size_t>(j)];
      chosen[static_cast<std::size_t>(t * K + j)] = e;
      const double wv = p[static_cast<std::size_t>(e)];
      cw[static_cast<std::size_t>(t * K + j)] = static_cast<float>(mo.norm ? wv / ws : wv);
    }
  }
  // 2. tokens grouped by expert: each expert's weights are read once per call.
  std::vector<std::vector<std::pair<i64, float>>> by(static_cast<std::size_t>(E));
  for (i64 t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j)
      by[static_cast<std::size_t>(chosen[static_cast<std::size_t>(t * K + j)])].push_back(
          {t, cw[static_cast<std::size_t>(t * K + j)]});
  std::memset(out, 0, static_cast<std::size_t>(T * H) * 4);
  for (i64 e = 0; e < E; ++e) {
    const auto& list = by[static_cast<std::size_t>(e)];
    if (list.empty()) continue;
    const i64 n = static_cast<i64>(list.size());
    float* xe = tl_f(5).get(static_cast<std::size_t>(n * H));
    float* ye = tl_f(7).get(static_cast<std::size_t>(n * H));
    for (i64 i = 0; i < n; ++i)
      std::memcpy(xe + i * H, x + list[static_cast<std::size_t>(i)].first * H, static_cast<std::size_t>(H) * 4);
    swiglu_expert(*mo.gate, *mo.up, *mo.down, e, xe, n, H, I, ye);
    for (i64 i = 0; i < n; ++i) {
      const auto& [t, wv] = list[static_cast<std::size_t>(i)];
      float* o = out + t * H;
      const float* yr = ye + i * H;
      for (i64 j = 0; j < H; ++j) o[j] += wv * yr[j];
    }
  }
  // 3. the shared expert on every token, scaled by sigmoid(x . shared_expert_gate) when there is one
  if (mo.sgate) {
    float* ys = tl_f(7).get(static_cast<std::size_t>(T * H));
    swiglu_expert(*mo.sgate, *mo.sup, *mo.sdown, 0, x, T, H, mo.Is, ys);
    for (i64 t = 0; t < T; ++t) {
      double s = 1.0;
      if (mo.seg) {
        double score = 0.0;
        for (i64 j = 0; j < H; ++j) score += static_cast<double>(x[t * H + j]) * mo.seg[j];
        s = 1.0 / (1.0 + std::exp(-score));
      }
      const float sf = static_cast<float>(s);
      for (i64 j = 0; j < H; ++j) out[t * H + j] += sf * ys[t * H + j];
    }
  }
}

}  // namespace
}  // namespace llm
}  // namespace hetero

using namespace hetero::llm;
using hetero::i64;

void bind_llm(py::module_& m) {
  m.def("llm_isa", [] { return std::string(lk().name); }, "The LLM kernel path in use (avx512vbmi/avx512vnni/avx512/avx2/generic).");
  m.def("llm_use_vnni", [](bool on) { g_use_vnni.store(on); }, py::arg("on"),
        "Allow (default) or forbid the AVX-512 VNNI path (tests of the non-VNNI AVX-512 path).");
  m.def("llm_use_vbmi", [](bool on) { g_use_vbmi.store(on); }, py::arg("on"),
        "Allow (default) or forbid the VNNI path's VBMI + GFNI variant (tests of the plain VNNI path).");
  m.def("llm_decode_split",
        [](int mode) { return mode < 0 ? bsplit::blocks_mode() : bsplit::g_blocks_mode.exchange(mode); },
        py::arg("mode"),
        "Sets the decode split (HETERO_LLM_BLOCKS: 0 equal tasks, 1 all by bytes, 2 q/k/v by bytes, 3 q/k/v and "
        "the big one-matrix GEMVs by bytes); returns the previous mode (mode < 0: only reads it).");
  m.def("llm_x_scale_block", [](const std::string& wtype) {
        QPack pk;
        return ggml_pack(wtype, pk) ? x_scale_block(lk(), pk) : 0;
      }, py::arg("wtype"),
        "Activation values per int8 scale for a GGUF weight type on the path in use (0 for a type it does not know).");

  py::class_<PyWeights>(m, "LlmWeights", "A QMatMul/MoE weight: block-quantized (repacked once) or float (in place).")
      .def_property_readonly("n", [](const PyWeights& w) { return w.w->n; })
      .def_property_readonly("k", [](const PyWeights& w) { return w.w->k; })
      .def_property_readonly("experts", [](const PyWeights& w) { return w.w->experts; })
      .def_property_readonly("nbytes", [](const PyWeights& w) {
        return w.w->quant ? w.w->experts * w.w->expert_bytes : static_cast<i64>(0);
      });
  m.def("llm_weights", [](const py::array& w, const std::string& wtype, int block_size, bool symmetric, i64 k) {
    return PyWeights{make_weights(w, wtype, block_size, symmetric, k)};
  }, py::arg("w"), py::arg("wtype"), py::arg("block_size") = 32, py::arg("symmetric") = true, py::arg("k"));
  m.def("llm_matmul", &py_qmatmul, py::arg("weights"), py::arg("x"), py::arg("out"), py::arg("bias") = py::none(),
        "out[..., N] = x[..., K] @ W^T (+ bias).");
  m.def("llm_swiglu", &py_swiglu, py::arg("gate"), py::arg("up"), py::arg("out"));
  m.def("llm_matmul_multi", &py_qmatmul_multi, py::arg("weights"), py::arg("x"), py::arg("outs"), py::arg("biases"),
        "outs[i] = x @ W_i^T (+ biases[i]) for every i: the matmuls of one input in one parallel region.");
  m.def("llm_matmul_swiglu", &py_qmatmul_swiglu, py::arg("gate_weights"), py::arg("up_weights"), py::arg("x"),
        py::arg("gate"), py::arg("up"), py::arg("out"), py::arg("gate_bias") = py::none(),
        py::arg("up_bias") = py::none(),
        "gate = x @ Wg^T, up = x @ Wu^T (+ biases), out = silu(gate) * up: one parallel region.");
  m.def("llm_matmul_residual", &py_qmatmul_residual, py::arg("weights"), py::arg("x"), py::arg("out"),
        py::arg("bias"), py::arg("residual"), py::arg("res_out"),
        "out = x @ W^T (+ bias); res_out = residual + out, in the matmul's epilogue.");

  m.def("llm_matmul_argmax", &py_qmatmul_argmax, py::arg("weights"), py::arg("x"), py::arg("out"), py::arg("bias"),
        py::arg("best"),
        "out = x @ W^T (+ bias); best[m] = numpy's argmax of out's row m (first NaN, else first maximum), each "
        "task reducing the columns it wrote.");

  py::class_<LlmStep>(m, "LlmStep",
                      "Consecutive calls of a decode step as one native call (hetero_cpu.fuse): ops run in order, "
                      "the GIL released once; a refused check runs the unfused calls (`fallback`) instead.")
      .def(py::init<>())
      .def("__len__", [](const LlmStep& s) { return s.ops.size(); })
      .def_readwrite("fallback", &LlmStep::fallback)
      .def_readwrite("timing", &LlmStep::timing, "Sum each op's wall time and pool statistics (take_times).")
      .def_readwrite("timing_cpu", &LlmStep::timing_cpu,
                     "With timing: each op's time in the process's CPU time (all threads) instead of wall time; "
                     "exact at 1 thread (another running thread's time is added at scheduler ticks).")
      .def_readwrite("timing_clean", &LlmStep::timing_clean,
                     "With timing (wall): also keep each op's clean runs, those during which every pool thread "
                     "ran throughout (take_clean).")
      .def("take_clean", &LlmStep::take_clean,
           "[([seconds of each clean run], pool_stats dict of those runs)] per op since the last take (timing and "
           "timing_clean on).")
      .def("take_times", &LlmStep::take_times,
           "[(seconds, pool_stats dict)] per op since the last take (timing on; the pool's statistics need "
           "pool_stats_enable); resets them.")
      .def("__call__", &LlmStep::operator(), "Runs the ops; False when a check refused and the fallback ran.")
      .def("add_matmul", [](LlmStep& s, const PyWeights& w, const py::array& x, const py::array& out,
                            const py::object& bias) {
        s.add({{}, prep_qmatmul(w, x, out, bias)}, py::make_tuple(w, x, out, bias), bsplit::plan_of({w.w.get()}));
      }, py::arg("weights"), py::arg("x"), py::arg("out"), py::arg("bias"))
      .def("add_matmul_multi", [](LlmStep& s, const py::list& ws, const py::array& x, const py::list& outs,
                                  const py::list& biases) {
        std::vector<const Weights*> w;
        for (const py::handle h : ws) w.push_back(&weights_of(h, "LlmStep.add_matmul_multi"));
        s.add({{}, prep_qmatmul_multi(ws, x, outs, biases)}, py::make_tuple(ws, x, outs, biases), bsplit::plan_of(w));
      }, py::arg("weights"), py::arg("x"), py::arg("outs"), py::arg("biases"))
      .def("add_matmul_swiglu", [](LlmStep& s, const PyWeights& pg, const PyWeights& pu, const py::array& x,
                                   const py::array& gate, const py::array& up, const py::array& out,
                                   const py::object& bg, const py::object& bu) {
        s.add({{}, prep_qmatmul_swiglu(pg, pu, x, gate, up, out, bg, bu)},
              py::make_tuple(pg, pu, x, gate, up, out, bg, bu), bsplit::plan_of({pg.w.get(), pu.w.get()}, true));
      }, py::arg("gate_weights"), py::arg("up_weights"), py::arg("x"), py::arg("gate"), py::arg("up"),
         py::arg("out"), py::arg("gate_bias"), py::arg("up_bias"))
      .def("add_matmul_residual", [](LlmStep& s, const PyWeights& w, const py::array& x, const py::array& out,
                                     const py::object& bias, const py::array& residual, const py::array& res_out) {
        s.add({{}, prep_qmatmul_residual(w, x, out, bias, residual, res_out)},
              py::make_tuple(w, x, out, bias, residual, res_out), bsplit::plan_of({w.w.get()}));
      }, py::arg("weights"), py::arg("x"), py::arg("out"), py::arg("bias"), py::arg("residual"), py::arg("res_out"))
      .def("add_matmul_argmax", [](LlmStep& s, const PyWeights& w, const py::array& x, const py::array& out,
                                   const py::object& bias, const py::array& best) {
        s.add({{}, prep_qmatmul_argmax(w, x, out, bias, best)}, py::make_tuple(w, x, out, bias, best),
              bsplit::plan_of({w.w.get()}));
      }, py::arg("weights"), py::arg("x"), py::arg("out"), py::arg("bias"), py::arg("best"))
      .def("add_swiglu", [](LlmStep& s, const py::array& g, const py::array& u, const py::array& out) {
        s.add({{}, prep_swiglu(g, u, out)}, py::make_tuple(g, u, out));
      }, py::arg("gate"), py::arg("up"), py::arg("out"))
      .def("add_rms_norm", [](LlmStep& s, const py::array& x, const py::array& scale, const py::array& out,
                              float eps) {
        s.add({{}, prep_rms_norm(x, scale, out, eps)}, py::make_tuple(x, scale, out));
      }, py::arg("x"), py::arg("scale"), py::arg("out"), py::arg("epsilon"))
      .def("add_rope", [](LlmStep& s, py::object table, const py::array& x, const py::array& out,
                          const py::array& past) {
        if (!py::isinstance<RopeTable>(table)) fail("LlmStep.add_rope: table must be an LlmRope");
        s.add(prep_rope_at(table.cast<RopeTable&>(), x, out, past), py::make_tuple(table, x, out, past));
      }, py::arg("table"), py::arg("x"), py::arg("out"), py::arg("past_len"))
      .def("add_attention", [](LlmStep& s, py::object cache, const py::array& q, const py::array& k,
                               const py::array& v, const py::array& past, float scale, const py::array& out) {
        if (!py::isinstance<Attention>(cache)) fail("LlmStep.add_attention: cache must be an LlmAttention");
        s.add(prep_attention_at(cache.cast<Attention&>(), q, k, v, past, scale, out),
              py::make_tuple(cache, q, k, v, past, out));
      }, py::arg("cache"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("past_len"), py::arg("scale"),
         py::arg("out"))
      .def("add_attention_slot", [](LlmStep& s, const py::list& caches, const py::array& q, const py::array& k,
                                    const py::array& v, const py::array& past, const py::array& slot, float scale,
                                    const py::array& out) {
        s.add(prep_attention_slot_at(caches, q, k, v, past, slot, scale, out),
              py::make_tuple(caches, q, k, v, past, slot, out));
      }, py::arg("caches"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("past_len"), py::arg("slot"),
         py::arg("scale"), py::arg("out"))
      .def("add_call", [](LlmStep& s, const std::string& name, const py::tuple& args) {
        s.add({{}, hetero::prepare_step_op(name, args)}, args);
      }, py::arg("name"), py::arg("args"),
         "Adds the call _native.<name>(*args) (one of step_ops()), prepared now, run on its arrays' values "
         "when the step runs.");

  py::class_<RopeTable>(m, "LlmRope", "Rotary cos/sin table (grown on demand) for RotaryEmbedding.")
      .def(py::init([](const py::array_t<double, py::array::c_style | py::array::forcecast>& inv_freq, double scale) {
             auto t = std::make_unique<RopeTable>();
             t->inv_freq.assign(inv_freq.data(), inv_freq.data() + inv_freq.size());
             t->half = static_cast<int>(inv_freq.size());
             t->scale = scale;
             return t;
           }),
           py::arg("inv_freq"), py::arg("scale") = 1.0)
      // past_len as a one-element int64 array read when it runs (a replay's bound call); before the int overload,
      // so an array is never converted to an int
      .def("__call__", [](RopeTable& tab, const py::array& x, const py::array& out, const py::array& past) {
        StepOp op = prep_rope_at(tab, x, out, past);
        if (!op.check()) fail("llm_rope: past_len must be >= 0");
        py::gil_scoped_release nogil;
        op.run();
      }, py::arg("x"), py::arg("out"), py::arg("past_len"))
      .def("__call__", &py_rope, py::arg("x"), py::arg("out"), py::arg("past_len"))
      .def("rows", &py_rope_rows, py::arg("x"), py::arg("out"), py::arg("positions"),
           "Each row of x at its own position (int64 [T]): a step of several sequences.");
  m.def("llm_attention_runs", &py_attention_runs, py::arg("caches"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("runs"), py::arg("scale"), py::arg("out"),
        "A step of several sequences: each run (cache index, start, end, position) of rows on its cache, one call.");
  m.def("llm_embedding", &py_embedding, py::arg("ids"), py::arg("table"), py::arg("wtype"), py::arg("block_size"),
        py::arg("symmetric"), py::arg("dim"), py::arg("out"));

  // kv_dtype: "f16" / "f32" / "q8" / "q4r" / "q3r" (the Attention op's attribute); a bool (True: f16) is still
  // accepted.
  auto make_attention = [](i64 kv_heads, i64 head_dim, i64 max_context, int kind) {
    if (kv_heads < 1 || head_dim < 1 || max_context < 1) fail("LlmAttention: sizes must be positive");
    if ((kind == KV_Q4R || kind == KV_Q3R) && (head_dim % hetero::kvq::kBlock || head_dim > 2048))
      fail("LlmAttention: kv_dtype " + std::string(kind == KV_Q4R ? "'q4r'" : "'q3r'") +
           " needs head_dim a multiple of " + std::to_string(hetero::kvq::kBlock) + " (at most 2048), got " +
           std::to_string(head_dim));
    auto a = std::make_unique<Attention>();
    a->hkv = kv_heads;
    a->d = head_dim;
    a->max_ctx = max_context;
    a->kind = kind;
    return a;
  };
  py::class_<Attention>(m, "LlmAttention",
                        "Causal GQA attention owning one layer's KV cache (float16, float32, int8 'q8', or the "
                        "rotated 4 / 3-bit 'q4r' / 'q3r').")
      .def(py::init([make_attention](i64 kv_heads, i64 head_dim, i64 max_context, const std::string& kv_dtype) {
             int kind = KV_F16;
             if (kv_dtype == "f32") kind = KV_F32;
             else if (kv_dtype == "q8") kind = KV_Q8;
             else if (kv_dtype == "q4r") kind = KV_Q4R;
             else if (kv_dtype == "q3r") kind = KV_Q3R;
             else if (kv_dtype != "f16")
               fail("LlmAttention: kv_dtype '" + kv_dtype + "'; expected f16, f32, q8, q4r or q3r");
             return make_attention(kv_heads, head_dim, max_context, kind);
           }),
           py::arg("kv_heads"), py::arg("head_dim"), py::arg("max_context"), py::arg("kv_dtype") = "f16")
      .def(py::init([make_attention](i64 kv_heads, i64 head_dim, i64 max_context, bool f16) {
             return make_attention(kv_heads, head_dim, max_context, f16 ? KV_F16 : KV_F32);
           }),
           py::arg("kv_heads"), py::arg("head_dim"), py::arg("max_context"), py::arg("f16"))
      .def_readonly("filled", &Attention::filled)
      .def_readonly("max_context", &Attention::max_ctx)
      .def("__call__", &py_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("past_len"),
           py::arg("scale"), py::arg("out"))
      .def("export", &py_attention_export, py::arg("n"),
           "The first n cached positions as (k, v, v_scales) uint8 [kv_heads, bytes] arrays in the cache's layout.")
      .def("load", &py_attention_load, py::arg("n"), py::arg("k"), py::arg("v"), py::arg("v_scales"),
           "Make the cache hold the first n positions of an export (of n or more) of a cache of the same shape and type.");

  py::class_<MoE>(m, "LlmMoE", "Routed SwiGLU experts (top-k; tokens grouped by expert) plus an optional shared expert.")
      .def(py::init([](const py::array& router, const PyWeights& gate, const PyWeights& up, const PyWeights& down,
                       int top_k, bool norm, const PyWeights* sgate, const PyWeights* sup, const PyWeights* sdown,
                       const py::object& seg) {
             need_f32c(router, "LlmMoE", "router");
             auto mo = std::make_unique<MoE>();
             mo->gate = gate.w;
             mo->up = up.w;
             mo->down = down.w;
             mo->E = router.shape(0);
             mo->H = router.shape(1);
             mo->I = gate.w->n;
             if (gate.w->experts != mo->E || up.w->experts != mo->E || down.w->experts != mo->E ||
                 gate.w->k != mo->H || up.w->n != mo->I || down.w->n != mo->H || down.w->k != mo->I)
               fail("LlmMoE: expert weight shapes do not match the router");
             if (top_k < 1 || top_k > mo->E) fail("LlmMoE: top_k out of range");
             mo->top_k = top_k;
             mo->norm = norm;
             mo->router_keep = router;
             mo->router = cfptr(router);
             if ((sgate != nullptr) != (sup != nullptr) || (sgate != nullptr) != (sdown != nullptr))
               fail("LlmMoE: the shared expert needs shared_gate, shared_up and shared_down");
             if (sgate) {
               mo->sgate = sgate->w;
               mo->sup = sup->w;
               mo->sdown = sdown->w;
               mo->Is = sgate->w->n;
               if (sgate->w->k != mo->H || sup->w->k != mo->H || sup->w->n != mo->Is || sdown->w->n != mo->H ||
                   sdown->w->k != mo->Is)
                 fail("LlmMoE: shared expert weight shapes do not match [I_s, hidden] / [hidden, I_s]");
             }
             if (!seg.is_none()) {
               if (!sgate) fail("LlmMoE: shared_expert_gate without a shared expert");
               const py::array a = seg.cast<py::array>();
               need_f32c(a, "LlmMoE", "shared_expert_gate");
               if (a.size() != mo->H) fail("LlmMoE: shared_expert_gate must hold hidden floats");
               mo->seg_keep = a;
               mo->seg = cfptr(a);
             }
             return mo;
           }),
           py::arg("router"), py::arg("gate"), py::arg("up"), py::arg("down"), py::arg("top_k"), py::arg("norm"),
           py::arg("shared_gate") = nullptr, py::arg("shared_up") = nullptr, py::arg("shared_down") = nullptr,
           py::arg("shared_expert_gate") = py::none())
      .def("__call__", [](const MoE& mo, const py::array& x, const py::array& out) {
        need_f32c(x, "llm_moe", "x");
        need_out(out, "llm_moe");
        if (x.ndim() != 2 || x.shape(1) != mo.H || out.size() != x.size()) fail("llm_moe: x must be [T, hidden]");
        const float* px = cfptr(x);
        float* po = fptr(out);
        const i64 T = x.shape(0);
        py::gil_scoped_release nogil;
        moe_run(mo, px, T, po);
      }, py::arg("x"), py::arg("out"));
}
