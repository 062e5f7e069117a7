// The quantized GEMM tiles of the CPU plugin (llm_impl.hpp's qgemm_fmt: the tile the plugin runs for M rows,
// qgemm_mr, qgemm_wide or llm_qgemm_rows.hpp's qgemm_rows; calls of up to the table's QGEMM_ROWS rows) on the same
// packed weights in one process, one thread: thread CPU time per pass over the matrix for M = 1, 2, 3, 4, 8, 9, 11,
// 12, 16 rows, alternated, the median of REPS, and a check that every row of an M-row tile is bitwise the one-row
// GEMV. Built and run by benchmarks/qgemm_rows.py, once per ISA (-DROWS_AVX512 /
// -DROWS_VNNI / -DROWS_VBMI with the AVX-512 flags, else AVX2) and once per source tree when it compares against a base revision.
//   qgemm_rows N K REPS [STREAM_MIB THREADS [CALLS_TASKS]]
// Output, one line per format: "<fmt> <N> <K> <bytes> <M=1 seconds> <hash of M=1's output> (<M> <seconds>)...".
// STREAM_MIB > 0: the one-row GEMV streamed from memory instead: THREADS threads each fill a buffer of about
// STREAM_MIB MiB on 2 MiB pages (as the plugin's WeightArena) with copies of the packed matrix and run M = 1 over all
// of them per pass, the passes started together (wall time until the slowest thread ends); <bytes> is what all the
// threads read per pass, the M=1 seconds are the median pass's wall time, and "cpu <seconds>" follows instead of M
// columns: the best pass's slowest thread's CPU time (on a busy machine the pass without the time a thread was
// descheduled); exits non-zero if a thread's output is not the one-row GEMV's.
// QGEMM_ROWS_CHUNK (environment, plain stream only): walk K in chunks of that many blocks (see there).
// QGEMM_ROWS_FORMATS (environment): comma-separated format names, only these run (default: all).
// CALLS_TASKS > 0 (a 7th argument, with STREAM_MIB): the calls mode, a decode step's GEMVs: the threads share one
// buffer of THREADS x the copies, each copy one call cut into THREADS x CALLS_TASKS equal tasks of 16-row groups,
// task i on thread i % THREADS (the pool's in-order claims of threads that keep pace), a barrier after each call.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "bench_threads.hpp"

#if defined(ROWS_VBMI)
#include "llm_simd_avx512vbmi.hpp"
using T = LlmSimdVbmi;
#elif defined(ROWS_VNNI)
#include "llm_simd_avx512vnni.hpp"
using T = LlmSimdVnni;
#elif defined(ROWS_AVX512)
#include "llm_simd_avx512.hpp"
using T = LlmSimd;
#else
#include "llm_simd_avx2.hpp"
using T = LlmSimd;
#endif
#include "llm_impl.hpp"

namespace {

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using Tile = void (*)(const QPack&, const std::uint8_t*, const XQ&, i64, int, float*, i64, int);
// Rows per qgemm_group call: S::QGEMM_ROWS, or QGEMM_MR in trees before it (--base)
template <class S, class = void>
struct RowsOf {
  static constexpr int v = S::QGEMM_MR;
};
template <class S>
struct RowsOf<S, std::void_t<decltype(S::QGEMM_ROWS)>> {
  static constexpr int v = S::QGEMM_ROWS;
};
constexpr int MS[] = {2, 3, 4, 8, 9, 11, 12, 16};

struct Case {
  const char* name;
  QPack pk;
  Tile tile;
};

template <int BITS, bool ASYM, int KQ>
Case make_case(const char* name, int kq, int sub, i64 n, i64 k) {
  Case c{name, {}, nullptr};
  c.pk.bits = BITS;
  c.pk.bs = 32;
  c.pk.asym = ASYM;
  c.pk.kq = kq;
  c.pk.sub = sub;
  c.pk.n = n;
  c.pk.k = k;
  c.pk.layout();
  c.tile = [](const QPack& w, const std::uint8_t* g, const XQ& x, i64 m0, int mr, float* y, i64 ldy, int nv) {
    constexpr int R = RowsOf<T>::v;
    for (int m = 0; m < mr; m += R)  // calls of up to R rows, as the plugin's drivers make
      qgemm_fmt<T, BITS, ASYM, KQ>(w, g, x, m0 + m, std::min(mr - m, R), y + m * ldy, ldy, nv);
  };
  return c;
}

// name is one of the comma-separated names of list
bool in_list(const char* list, const char* name) {
  const std::size_t len = std::strlen(name);
  for (const char* p = list; *p;) {
    const char* e = std::strchr(p, ',');
    const std::size_t n = e ? static_cast<std::size_t>(e - p) : std::strlen(p);
    if (n == len && std::strncmp(p, name, len) == 0) return true;
    if (!e) break;
    p = e + 1;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const i64 n = argc > 1 ? std::atol(argv[1]) : 8960, k = argc > 2 ? std::atol(argv[2]) : 1536;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 15;
  const i64 stream_mib = argc > 4 ? std::atol(argv[4]) : 0;
  const int nthreads = argc > 5 ? std::max(1, std::atoi(argv[5])) : 1;
  const int calls_tasks = argc > 6 ? std::atoi(argv[6]) : 0;  // > 0: the calls mode, this many tasks a thread
  std::mt19937 gen(1);
  // sub as the plugin packs them (llm_ggml.cpp's ggml_pack: q5_0 / q5_1 in runs of 8 records; hetero's q4 / q8: 1)
  const Case cases[] = {make_case<4, true, 1>("q4_k", 1, 8, n, k), make_case<6, false, 2>("q6_k", 2, 8, n, k),
                        make_case<4, false, 0>("q4_0", 0, 1, n, k), make_case<8, false, 0>("q8_0", 0, 1, n, k),
                        make_case<5, false, 0>("q5_0", 0, 8, n, k), make_case<5, true, 0>("q5_1", 0, 8, n, k),
                        make_case<5, true, 1>("q5_k", 1, 8, n, k)};
  const char* only = std::getenv("QGEMM_ROWS_FORMATS");  // comma-separated names: run only these formats
  for (const Case& c : cases) {
    if (only && !in_list(only, c.name)) continue;
    const QPack& pk = c.pk;
    std::vector<std::uint8_t> w(static_cast<std::size_t>(pk.groups * pk.group_bytes));
    for (auto& b : w) b = static_cast<std::uint8_t>(gen());
    // Finite f16 scales: every d / dmin field of either sign, 2^-9..2^-6 (bits 0x1800-0x27ff: a random exponent and
    // mantissa); the quants and 6/8-bit scales stay random.
    auto f16 = [&](std::uint8_t* p) {
      const unsigned h = (gen() & 0x8000u) | (0x1800u + gen() % 0x1000u);
      p[0] = static_cast<std::uint8_t>(h), p[1] = static_cast<std::uint8_t>(h >> 8);
    };
    for (i64 g = 0; g < pk.groups; ++g)
      for (i64 b = 0; b < pk.nb; ++b) {
        std::uint8_t* grp = w.data() + g * pk.group_bytes;
        if (pk.kq) {
          if (b % pk.sub == 0)
            for (i64 i = 0; i < pk.sb_hdr; i += 2) f16(grp + (b / pk.sub) * pk.super_bytes + i);
        } else {
          std::uint8_t* rec = const_cast<std::uint8_t*>(pk.record(grp, b));
          for (i64 i = 0; i < pk.header_bytes(); i += 2) f16(rec + i);
        }
      }
    const i64 M = 16, nb = pk.nb;
    std::vector<std::int8_t> xq(static_cast<std::size_t>(M * nb * 32));
    std::vector<float> d(M * nb), ds(M * nb);
    std::vector<std::int32_t> s(M * nb), sl(M * nb);
    for (auto& v : xq) v = static_cast<std::int8_t>(static_cast<int>(gen() % 255) - 127);
    for (i64 i = 0; i < M * nb; ++i) {
      std::int32_t sum = 0, half = 0;
      for (int j = 0; j < 32; ++j) sum += xq[i * 32 + j], half += j < 16 ? xq[i * 32 + j] : 0;
      d[i] = 0.01f + 0.001f * static_cast<float>(i % 7), s[i] = sum, sl[i] = half;
      ds[i] = d[i] * static_cast<float>(sum);
    }
    const XQ x{xq.data(), d.data(), s.data(), ds.data(), sl.data(), nb * 32, nb};
    std::vector<float> y1(M * n), ya(M * n), yb(M * n);
    auto run = [&](int mr, i64 m0, std::vector<float>& y) {
      const double t0 = cpu_seconds();
      for (i64 g = 0; g < pk.groups; ++g)
        c.tile(pk, w.data() + g * pk.group_bytes, x, m0, mr, y.data() + g * QR, n,
               static_cast<int>(std::min<i64>(QR, n - g * QR)));
      return cpu_seconds() - t0;
    };
    for (i64 m = 0; m < M; ++m) run(1, m, y1), std::memcpy(yb.data() + m * n, y1.data(), sizeof(float) * n);
    std::uint64_t hash = 1469598103934665603ull;  // FNV-1a of the one-row outputs: the numerics of two builds
    for (std::size_t i = 0; i < yb.size() * sizeof(float); ++i)
      hash = (hash ^ reinterpret_cast<const std::uint8_t*>(yb.data())[i]) * 1099511628211ull;
    auto med = [](std::vector<double> v) { return std::sort(v.begin(), v.end()), v[v.size() / 2]; };
    if (stream_mib > 0) {
      const std::size_t mbytes = w.size(), copies = std::max<std::size_t>(1, (stream_mib << 20) / mbytes);
      bench::Barrier barrier(nthreads), call_barrier(nthreads);
      bench::PassClock clock(nthreads, reps + 1);
      std::atomic<bool> differs{false};  // a thread's output over its last copy is not the one-row GEMV's
      std::vector<double> secs, cpu(static_cast<std::size_t>(reps), 0.0);  // cpu: the slowest thread's CPU time
      std::mutex cpu_mu;
      std::vector<std::thread> threads;
      // calls mode: one buffer shared by the threads, each copy one call split as the plugin splits a decode GEMV
      std::uint8_t* shared = nullptr;
      std::vector<i64> cut{0};
      if (calls_tasks > 0) {
        shared = static_cast<std::uint8_t*>(bench::page_alloc(copies * nthreads * mbytes, true));
        for (std::size_t j = 0; j < copies * static_cast<std::size_t>(nthreads); ++j)
          std::memcpy(shared + j * mbytes, w.data(), mbytes);
        const i64 ntask = std::min<i64>(pk.groups, static_cast<i64>(nthreads) * calls_tasks);
        for (i64 t = 1; t <= ntask; ++t) cut.push_back(pk.groups * t / ntask);
      }
      // QGEMM_ROWS_CHUNK = C blocks (a multiple of the format's super-block): the plain stream walks K in chunks
      // of C blocks, each chunk over all the groups of the copy before the next (the activations of one chunk stay
      // in L1, the weights stream in pieces of C records a group); the partial sums are added (other bits: checked
      // against the one-row GEMV to a relative 1e-4 instead).
      const char* chunk_env = std::getenv("QGEMM_ROWS_CHUNK");
      const i64 chunk = chunk_env ? (std::max<i64>(1, std::atol(chunk_env)) + pk.sub - 1) / pk.sub * pk.sub : 0;
      std::vector<QPack> views;
      std::vector<i64> offs;
      std::vector<XQ> xvs;
      for (i64 b0 = 0; chunk > 0 && chunk < nb && b0 < nb; b0 += chunk) {
        QPack v = pk;
        v.k = std::min(chunk, nb - b0) * pk.bs;
        v.layout();
        views.push_back(v);
        offs.push_back(b0 / pk.sub * pk.super_bytes);
        xvs.push_back(XQ{x.q + b0 * pk.bs, x.d + b0, x.s + b0, x.ds + b0, x.sl + b0, x.ldq, x.nb});
      }
      // QGEMM_ROWS_CHUNK_MAJOR=1 (with a chunk): the copies laid out chunk by chunk (chunk c's pieces of all the
      // groups one after another), so that the chunked walk streams contiguously (a repack, not the plugin's layout)
      const char* major_env = std::getenv("QGEMM_ROWS_CHUNK_MAJOR");
      const bool major = !views.empty() && major_env && std::atoi(major_env) != 0;
      std::vector<i64> at(views.size() + 1, 0);  // chunk c's pieces start at at[c] in a copy
      for (std::size_t ci = 0; ci < views.size(); ++ci) at[ci + 1] = at[ci] + pk.groups * views[ci].group_bytes;
      auto piece = [&](std::size_t ci, i64 g) {  // where group g's piece of chunk ci lies in a copy
        return major ? at[ci] + g * views[ci].group_bytes : g * pk.group_bytes + offs[ci];
      };
      auto fill = [&](std::uint8_t* copy) {
        if (!major) return static_cast<void>(std::memcpy(copy, w.data(), mbytes));
        for (std::size_t ci = 0; ci < views.size(); ++ci)
          for (i64 g = 0; g < pk.groups; ++g)
            std::memcpy(copy + piece(ci, g), w.data() + g * pk.group_bytes + offs[ci],
                        static_cast<std::size_t>(views[ci].group_bytes));
      };
      for (int t = 0; t < nthreads; ++t)
        threads.emplace_back([&, t] {
          auto* buf = shared ? nullptr : static_cast<std::uint8_t*>(bench::page_alloc(copies * mbytes, true));
          if (buf)
            for (std::size_t j = 0; j < copies; ++j) fill(buf + j * mbytes);  // first touch
          std::vector<float> yt(static_cast<std::size_t>(n));
          for (int r = 0; r <= reps; ++r) {  // pass 0: warm-up
            barrier.wait();
            clock.start(t, r);
            const double c0 = cpu_seconds();
            if (buf && !views.empty()) {
              std::vector<float> part(static_cast<std::size_t>(n));
              for (std::size_t j = 0; j < copies; ++j)
                for (std::size_t ci = 0; ci < views.size(); ++ci)
                  for (i64 g = 0; g < pk.groups; ++g) {
                    const int nv = static_cast<int>(std::min<i64>(QR, n - g * QR));
                    float* out = (ci ? part.data() : yt.data()) + g * QR;
                    c.tile(views[ci], buf + j * mbytes + piece(ci, g), xvs[ci], 0, 1, out, n, nv);
                    if (ci)
                      for (int i = 0; i < nv; ++i) yt[static_cast<std::size_t>(g * QR + i)] += out[i];
                  }
            } else if (buf) {
              for (std::size_t j = 0; j < copies; ++j)
                for (i64 g = 0; g < pk.groups; ++g)
                  c.tile(pk, buf + j * mbytes + g * pk.group_bytes, x, 0, 1, yt.data() + g * QR, n,
                         static_cast<int>(std::min<i64>(QR, n - g * QR)));
            } else {  // task i of each call on thread i % nthreads (the pool's in-order claims), a barrier a call
              for (std::size_t j = 0; j < copies * static_cast<std::size_t>(nthreads); ++j) {
                for (std::size_t i = static_cast<std::size_t>(t); i + 1 < cut.size(); i += nthreads)
                  for (i64 g = cut[i]; g < cut[i + 1]; ++g)
                    c.tile(pk, shared + j * mbytes + g * pk.group_bytes, x, 0, 1, yt.data() + g * QR, n,
                           static_cast<int>(std::min<i64>(QR, n - g * QR)));
                call_barrier.wait();
              }
            }
            const double c1 = cpu_seconds() - c0;
            clock.end(t, r);
            {
              std::lock_guard<std::mutex> lock(cpu_mu);
              if (r) cpu[static_cast<std::size_t>(r - 1)] = std::max(cpu[static_cast<std::size_t>(r - 1)], c1);
            }
            barrier.wait();
          }
          if (buf && views.empty() &&
              std::memcmp(yt.data(), yb.data(), sizeof(float) * static_cast<std::size_t>(n)) != 0)
            differs = true;
          if (buf && !views.empty()) {  // chunked: another order of the float sums
            float big = 0.0f;
            for (i64 i = 0; i < n; ++i) big = std::max(big, std::abs(yb[static_cast<std::size_t>(i)]));
            for (i64 i = 0; i < n; ++i)
              if (std::abs(yt[static_cast<std::size_t>(i)] - yb[static_cast<std::size_t>(i)]) > 1e-4f * big)
                differs = true;
          }
          for (std::size_t i = static_cast<std::size_t>(t); !buf && i + 1 < cut.size(); i += nthreads) {  // its tasks
            const i64 a = cut[i] * QR, e = std::min<i64>(n, cut[i + 1] * QR);
            if (std::memcmp(yt.data() + a, yb.data() + a, sizeof(float) * static_cast<std::size_t>(e - a)) != 0)
              differs = true;
          }
          std::free(buf);
        });
      for (auto& th : threads) th.join();
      std::free(shared);
      for (int r = 1; r <= reps; ++r) secs.push_back(clock.seconds(r));
      if (differs) {
        std::fprintf(stderr, "%s: the streamed GEMV differs from the one-row GEMV\n", c.name);
        return 1;
      }
      std::printf("%s %lld %lld %lld %.9f %016llx cpu %.9f\n", c.name, static_cast<long long>(n),
                  static_cast<long long>(k), static_cast<long long>(copies * mbytes * nthreads), med(secs),
                  static_cast<unsigned long long>(hash), *std::min_element(cpu.begin(), cpu.end()));
      std::fflush(stdout);
      continue;
    }
    std::vector<double> one, tm[17];
    for (int r = 0; r < reps; ++r) {
      one.push_back(run(1, 0, ya));
      for (int mr : MS) {
        tm[mr].push_back(run(mr, 0, ya));
        if (std::memcmp(ya.data(), yb.data(), sizeof(float) * static_cast<std::size_t>(mr * n)) != 0) {
          std::fprintf(stderr, "%s M=%d: a row of the tile differs from the one-row GEMV\n", c.name, mr);
          return 1;
        }
      }
    }
    std::printf("%s %lld %lld %lld %.9f %016llx", c.name, static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(pk.groups * pk.group_bytes), med(one), static_cast<unsigned long long>(hash));
    for (int mr : MS) std::printf(" %d %.9f", mr, med(tm[mr]));
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
