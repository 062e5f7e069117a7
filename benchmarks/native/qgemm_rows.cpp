// A/B of the two quantized GEMM tiles of a few rows (llm_impl.hpp's qgemm_mr, llm_qgemm_rows.hpp's qgemm_rows) on
// the same packed weights in one process, one thread: thread CPU time per call for M = 1..8 rows, alternated, the
// median of REPS, and a check that both write the same bits. Built and run by benchmarks/qgemm_rows.py, once per
// ISA (-DROWS_AVX512 with the AVX-512 flags, else AVX2).
//   qgemm_rows N K REPS
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#ifdef ROWS_AVX512
#include "llm_simd_avx512.hpp"
#else
#include "llm_simd_avx2.hpp"
#endif
#include "llm_impl.hpp"

namespace {

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using Tile = void (*)(const QPack&, const std::uint8_t*, const XQ&, i64, float*, i64, int);

struct Case {
  const char* name;
  QPack pk;
  Tile mr[9], rows[9];
};

template <int BITS, bool ASYM, int KQ>
Case make_case(const char* name, int bits, int kq, int sub, i64 n, i64 k) {
  Case c{name, {}, {}, {}};
  c.pk.bits = bits;
  c.pk.bs = 32;
  c.pk.asym = ASYM;
  c.pk.kq = kq;
  c.pk.sub = sub;
  c.pk.n = n;
  c.pk.k = k;
  c.pk.layout();
  c.mr[1] = qgemm_mr<LlmSimd, BITS, ASYM, KQ, 1>;
  c.mr[2] = qgemm_mr<LlmSimd, BITS, ASYM, KQ, 2>;
  c.mr[4] = qgemm_mr<LlmSimd, BITS, ASYM, KQ, 4>;
  c.mr[8] = qgemm_mr<LlmSimd, BITS, ASYM, KQ, 8>;
  c.rows[2] = qgemm_rows<LlmSimd, BITS, ASYM, KQ, 2>;
  c.rows[4] = qgemm_rows<LlmSimd, BITS, ASYM, KQ, 4>;
  c.rows[8] = qgemm_rows<LlmSimd, BITS, ASYM, KQ, 8>;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const i64 n = argc > 1 ? std::atol(argv[1]) : 8960, k = argc > 2 ? std::atol(argv[2]) : 1536;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 15;
  std::mt19937 gen(1);
  const Case cases[] = {make_case<4, true, 1>("q4_k", 4, 1, 8, n, k), make_case<6, false, 2>("q6_k", 6, 2, 8, n, k),
                        make_case<4, false, 0>("q4_0", 4, 0, 1, n, k)};
  for (const Case& c : cases) {
    const QPack& pk = c.pk;
    std::vector<std::uint8_t> w(static_cast<std::size_t>(pk.groups * pk.group_bytes));
    for (auto& b : w) b = static_cast<std::uint8_t>(gen());
    // Finite f16 scales: every d / dmin field 0x2000 (~0.0078); the quants and 6/8-bit scales stay random.
    for (i64 g = 0; g < pk.groups; ++g)
      for (i64 b = 0; b < pk.nb; ++b) {
        std::uint8_t* grp = w.data() + g * pk.group_bytes;
        if (pk.kq) {
          if (b % pk.sub == 0)
            for (i64 i = 0; i < pk.sb_hdr; i += 2) grp[(b / pk.sub) * pk.super_bytes + i] = 0, grp[(b / pk.sub) * pk.super_bytes + i + 1] = 0x20;
        } else {
          std::uint8_t* rec = const_cast<std::uint8_t*>(pk.record(grp, b));
          for (i64 i = 0; i < pk.header_bytes(); i += 2) rec[i] = 0, rec[i + 1] = 0x20;
        }
      }
    const i64 M = 8, nb = pk.nb;
    std::vector<std::int8_t> xq(static_cast<std::size_t>(M * nb * 32));
    std::vector<float> d(M * nb), ds(M * nb);
    std::vector<std::int32_t> s(M * nb), sl(M * nb);
    for (auto& v : xq) v = static_cast<std::int8_t>(static_cast<int>(gen() % 255) - 127);
    for (i64 i = 0; i < M * nb; ++i) {
      std::int32_t sum = 0, half = 0;
      for (int j = 0; j < 32; ++j) sum += xq[i * 32 + j], half += j < 16 ? xq[i * 32 + j] : 0;
      d[i] = 0.01f, s[i] = sum, sl[i] = half, ds[i] = 0.01f * static_cast<float>(sum);
    }
    const XQ x{xq.data(), d.data(), s.data(), ds.data(), sl.data(), nb * 32, nb};
    std::vector<float> ya(M * n), yb(M * n);
    auto run = [&](Tile f, int mr, std::vector<float>& y) {
      const double t0 = cpu_seconds();
      for (i64 g = 0; g < pk.groups; ++g)
        f(pk, w.data() + g * pk.group_bytes, x, 0, y.data() + g * QR, n, static_cast<int>(std::min<i64>(QR, n - g * QR)));
      return cpu_seconds() - t0;
    };
    std::vector<double> one, tm[9], tr[9];
    for (int r = 0; r < reps; ++r) {
      one.push_back(run(c.mr[1], 1, ya));
      for (int mr : {2, 4, 8}) {
        tm[mr].push_back(run(c.mr[mr], mr, ya));
        tr[mr].push_back(run(c.rows[mr], mr, yb));
        if (std::memcmp(ya.data(), yb.data(), sizeof(float) * static_cast<std::size_t>(mr * n)) != 0) {
          std::printf("%s M=%d: qgemm_rows differs from qgemm_mr\n", c.name, mr);
          return 1;
        }
      }
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    const double t1 = med(one);
    std::printf("%s %lldx%lld: M=1 %.3f ms", c.name, static_cast<long long>(n), static_cast<long long>(k), 1e3 * t1);
    for (int mr : {2, 4, 8})
      std::printf(" | M=%d mr %.2fx rows %.2fx", mr, med(tm[mr]) / t1, med(tr[mr]) / t1);
    std::printf("\n");
  }
  return 0;
}
