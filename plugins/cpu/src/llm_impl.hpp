// The LLM kernels (see LlmKernels in llm.hpp), written once against a traits class S (llm_simd_<isa>.hpp: W float
// / int32 lanes, W x 4 byte lanes, the ISA's int8 dot). Each llm_kernels_<isa>.cpp includes its traits header
// and this file and instantiates llm_table<S>, so everything here is compiled once per ISA with that file's
// flags. Everything lives in an anonymous namespace: the copies compiled with different -m flags must never be
// merged by the linker.
//
// Within each output element the arithmetic (and its order) is the same on every path; W only decides how many
// elements a step computes, and the register counts (S::QGEMM_MR, ...) how the rows are blocked.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "llm.hpp"

namespace {

using hetero::i64;
using namespace hetero::llm;

// ---------------------------------------------------------------------------------------------- activations
// One block of bs values of row xr (from lo, k of them valid) times inv, rounded and clamped to int8 into qb; returns
// the block's sum and that of its first half (q6_k's per-16 scales).
template <class S>
inline std::pair<std::int32_t, std::int32_t> quantize_block(const float* xr, i64 lo, i64 k, int bs,
                                                            typename S::V vinv, std::int8_t* qb) {
  using I = typename S::I;
  I vsum = S::iset1(0), vhalf = S::iset1(0);
  for (int i = 0; i < bs; i += S::W) {
    const I qi = S::iclamp(S::cvt_i(S::round(S::mul(S::load_n(xr + lo + i, k - (lo + i)), vinv))), 127);
    vsum = S::iadd(vsum, qi);
    if (i < bs / 2) vhalf = S::iadd(vhalf, qi);
    S::store_i8(qb + i, qi);
  }
  return {S::ihsum(vsum), S::ihsum(vhalf)};
}

// One scale per sbs values (bs per block, sbs a multiple of bs): each block of a scale block stores that scale in
// d (and d * its own sum in ds).
template <class S>
void quantize_x(const float* x, i64 M, i64 ldx, i64 k, int bs, int sbs, bool pair4, std::int8_t* q, float* d,
                std::int32_t* s, float* ds, std::int32_t* sl) {
  using V = typename S::V;
  const i64 nb = (k + bs - 1) / bs, per = sbs / bs;
  for (i64 m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    for (i64 b0 = 0; b0 < nb; b0 += per) {
      const i64 b1 = std::min(nb, b0 + per);
      V vmax = S::zero();
      for (i64 i = b0 * bs; i < b1 * bs; i += S::W) vmax = S::max(vmax, S::abs(S::load_n(xr + i, k - i)));
      const float amax = S::hmax(vmax);
      const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      for (i64 b = b0; b < b1; ++b) {
        std::int8_t* qb = q + m * nb * bs + b * bs;
        const auto [sum, half] = quantize_block<S>(xr, b * bs, k, bs, S::set1(inv), qb);
        if (pair4) pair_words(qb, bs);
        d[m * nb + b] = dx;
        s[m * nb + b] = sum;
        ds[m * nb + b] = dx * static_cast<float>(sum);
        sl[m * nb + b] = half;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------- quantized GEMM
// How far ahead of the weight stream the quantized tiles prefetch, and where to: MR <= 2 rows (decode) and calls of up
// to 16 rows into L2 (S::prefetch_l2), larger calls (prefill) into L1; 0 issues no prefetch at all (prefetch_record).
// Defaults, from the Zen 4 VM where every table since 2026-12-03 was measured: none, except 3 KiB into L2 for the
// 8-bit one-row tile; only the 8-bit tiles hold prefetch code at all (prefetch_record). From a62fe70 (2026-12-03) to branch dec25 no tile issued a prefetch whatever the setting (GCC
// deleted the calls, see prefetch_record), so every measurement of that time ran without; emitted again, 3 KiB ahead
// made the 4/5/6-bit one-row tiles stream at 0.6-0.9x their rate without (benchmarks/qgemm_rows.py --stream-mib,
// 256 B-8 KiB no better) and the real 1.5B Q4_K_M's decode step 1.24x slower, while q8_0 (more arithmetic a byte)
// streamed 1.15-1.3x faster and its decode step took 0.85x the time (docs/llm-benchmarks.md, dec25). The earlier
// measurements of this choice (L2 against L1, 3 KiB for one row, 6 KiB for 2+ rows: dec11, dec13, la23, dec24) are
// either from before a62fe70 (another machine: Intel) or were of no prefetch against no prefetch. The fast phase of
// this VM's memory (2-thread probes 65-72 GB/s, against 37-43 in the slow one) changes nothing: streamed at 2 threads
// the 4-bit one-row tiles read 98-99% of the probe with no prefetch, 1 KiB ahead took 1.01-1.02x the time and 3 KiB
// 1.11x (q4_k) / 1.48x (q4_0), while q8_0 without its 3 KiB took 1.09x; 1 thread the same (qgemm_rows.py
// --phase-gbs, CPU time, branch pf30). The 4-bit decode step's shortfall in that phase is not its tiles' stream.
// Settings: HETERO_LLM_PF (8-bit one-row tiles), HETERO_LLM_PF_ROWS (2-16 rows, every format), HETERO_LLM_PF_L1
// (prefill).
inline i64 env_bytes(const char* name, i64 fallback) {
  const char* e = std::getenv(name);
  return e ? std::atol(e) : fallback;
}
template <int MR>
inline bool prefetch_into_l2(const XQ& x) { return MR <= 2 || x.rows <= 16; }
// The 2-16-row tiles (a verify step, into L2) by default 8 KiB ahead where that streamed faster (branch vt31, the
// first measurement with the 4/5/6-bit rows' prefetch emitted, benchmarks/verify_tiles.py on the real 1.5B Q4_K_M and
// 0.5B Q5_0, paired against 0): q6_k at every row count (down_proj / LM head at 2-4 rows 1.8-2.4x -> 1.1-1.3x a
// one-row GEMV), the other formats in the tiles of 8+ rows, which are arithmetic-bound (8 rows: q5_0 4.4x -> 2.3x,
// q4_k 3.9x -> 3.5x, q8_0 1.95x -> 1.7x); it cost q4_k at 2-4 rows 1.0-1.6x -> 1.6-2.7x and at 5 rows 1.08-1.16x the
// time, q8_0 at 2-4 rows 1.05-1.35x -> 1.3-1.5x, so none there. Except qgemm_mr's q4_k 4-row tile: 2 KiB ahead
// into L1 (rows_into_l1; vt31b, verify_tiles.py paired in one build: 1.76x -> 1.55x a one-row GEMV; into L2 at 2 KiB
// 2.7x, at 1 KiB 1.70x; into L1 at 2-3 rows 1.07 -> 1.26x and 1.30 -> 1.34x, so not there).
template <int MR, int BITS, int KQ>
constexpr bool rows_into_l1() { return MR == 4 && BITS == 4 && KQ == 1; }
template <int MR, int BITS = 4, bool L1 = false>
inline i64 prefetch_distance(bool l2) {
  static const i64 one = env_bytes("HETERO_LLM_PF", BITS == 8 ? 3072 : 0),
                   rows = env_bytes("HETERO_LLM_PF_ROWS", L1 ? 2048 : MR >= 2 && (BITS == 6 || MR >= 8) ? 8192 : 0),
                   l1 = env_bytes("HETERO_LLM_PF_L1", 0);
  return l2 ? (MR == 1 ? one : rows) : l1;
}
// The one-row tile's distance (for callers that do not name their rows).
inline i64 prefetch_distance(bool l2) { return prefetch_distance<1>(l2); }

// The values of step t (t < 4) of a 4/5/6-bit record, slice h (rows W*h..): lo (elements 4t+c) and hi (B/2+4t+c)
// from the quant vector v and (5/6-bit) the record's high plane(s) hp (layout in llm.hpp). The 16-bit shifts move
// bits across byte borders only into bits the masks drop.
template <class S, int BITS>
inline void unpack_step(typename S::B v, const std::uint8_t* hp, int t, int h, typename S::B& lo,
                        typename S::B& hi) {
  if (BITS == 5) {  // lo: bits 0-4 of v; hi: v's bits 5-7 as its bits 2-4, hv's bits 2t, 2t+1 as its bits 0-1
    // (v's bits 5-7 cleared of the rest before the 16-bit shift, by the same constant as lo: two constants, not
    // three -- AVX2's 8-row tile of q5_k spilled with three, 1.07-1.14x the former layout's time at 8-16 rows).
    // hv's load is left to the compiler with 16 registers (AVX2: folded into the shift, one register fewer; q5_k
    // 8-16 rows 0.93-0.95x the time) and kept in a register with 32 (AVX-512: the fold cost q5_0 / q5_1 1.01-1.11x).
    const auto hv0 = S::load_b(hp + 4 * S::W * h), m5 = S::bset8(0x1f);
    const auto hv = S::W < 16 ? hv0 : S::opaque(hv0);
    lo = S::band(v, m5);
    hi = S::bor(S::bsrl16(S::bandnot(m5, v), 3), S::band(S::bsrl16(hv, 2 * t), S::bset8(0x03)));
    return;
  }
  const auto nib = S::bset8(0x0f);
  lo = S::band(v, nib), hi = S::band(S::bsrl4(v), nib);
  if (BITS == 6) {
    const auto hv = S::opaque(S::load_b(hp + 64 * (t / 2) + 4 * S::W * h)), m = S::bset8(0x30);
    const int u = 2 * (t % 2);
    lo = S::bor(lo, S::band(S::bsll16(hv, 4 - u), m));
    hi = S::bor(hi, S::band(S::bsrl16(hv, u), m));
  }
}

// S::SIX_BIT_GF: the traits unpack a 6-bit step (its nibble vector v and high-bit vector hv, u = t % 2) in fewer
// operations than unpack_step (llm_simd_avx512vbmi.hpp: gf2p8affineqb); the same bytes. q6_k's one-row tile only:
// the many-row tiles keep unpack_step.
template <class S, class = void>
struct HasSixBitGf : std::false_type {};
template <class S>
struct HasSixBitGf<S, std::enable_if_t<S::SIX_BIT_GF>> : std::true_type {};

// S::FIVE_BIT_GF: the traits unpack a 5-bit step in fewer operations than unpack_step, the high values as 8 x their
// value (llm_simd_avx512vbmi.hpp); the same integer dots once the high chain's sum is shifted right by 3. The
// one-row tile only.
template <class S, class = void>
struct HasFiveBitGf : std::false_type {};
template <class S>
struct HasFiveBitGf<S, std::enable_if_t<S::FIVE_BIT_GF>> : std::true_type {};

// S::DOT_AT: the traits dot weights with the 4 activation bytes at a pointer, broadcast by the dot itself
// (llm_simd_avx512vnni.hpp); else broadcast (S::bcast4) and dotted. The same integers either way.
template <class S, class = void>
struct HasDotAt : std::false_type {};
template <class S>
struct HasDotAt<S, std::enable_if_t<S::DOT_AT>> : std::true_type {};

template <class S>
inline typename S::I dot4_at(typename S::I acc, typename S::B w, const std::int8_t* p) {
  if constexpr (HasDotAt<S>::value) return S::dot4_at(acc, w, p);
  else return S::dot4(acc, w, S::bcast4(p));
}
template <class S>
inline typename S::I dot4x2_at(typename S::I acc, typename S::B w1, const std::int8_t* p1, typename S::B w2,
                               const std::int8_t* p2) {
  if constexpr (HasDotAt<S>::value) return S::dot4_at(S::dot4_at(acc, w1, p1), w2, p2);
  else return S::dot4x2(acc, w1, S::bcast4(p1), w2, S::bcast4(p2));
}
template <class S>
inline typename S::I dot_q8_at(typename S::I acc, const typename S::Q8& w, const std::int8_t* p) {
  if constexpr (HasDotAt<S>::value) return S::dot_q8_at(acc, w, p);
  else return S::dot_q8(acc, w, S::bcast4(p));
}

// A k-quant super-block's d (and dmin) for slice h (rows W*h..), and each times 2^23 (exact) for S::u8_scaled.
template <class S>
struct SuperScales {
  using V = typename S::V;
  V sd = S::zero(), smin = S::zero(), sd23 = S::zero(), smin23 = S::zero();
};

// S::U8_SCALED: the traits compute d * p[i] (rounded once) from the u8 scales at p in fewer operations than
// load_u8 and mul (llm_simd_avx512.hpp); else the plain form.
template <class S, class = void>
struct HasU8Scaled : std::false_type {};
template <class S>
struct HasU8Scaled<S, std::enable_if_t<S::U8_SCALED>> : std::true_type {};

// d * (float)p[i] for the W u8 values at p, one rounding (bitwise the product of the plain form for finite d).
template <class S>
inline typename S::V u8_scaled(const std::uint8_t* p, typename S::V d, typename S::V d23) {
  if constexpr (HasU8Scaled<S>::value) return S::u8_scaled(p, d, d23);
  else return (void)d23, S::mul(d, S::load_u8(p));
}

// S::K_SUPER: the k-quant tiles take activations with one scale per super-block (LlmKernels::k_super) and sum a
// super-block's scaled int32 dots in integer (BlockScales::add_int), then convert once (super_mins, super_end).
template <class S, class = void>
struct HasKSuper : std::false_type {};
template <class S>
struct HasKSuper<S, std::enable_if_t<S::K_SUPER>> : std::true_type {};
template <class S, int KQ>
constexpr bool k_super() { return KQ != 0 && HasKSuper<S>::value; }

// The one-row tile of the symmetric kq-0 formats (q4_0, q5_0, q8_0) where the int8 dot takes unsigned bytes as
// stored (S::DOT_U8: VNNI), so the zero offset is a power of two (8, 16; q8: 128): the offset times the block's x sum
// subtracted as the x sum shifted left (vpslld of a broadcast load), instead of BlockScales::apply's scalar multiply,
// broadcast from a general register and subtract: no operation on the multiply pipes, which the dots fill (q4_0's
// one-row tile in L2: 0.88x the time with the subtraction left out, a probe; one vpdpwssd of the x sum's int16 half
// instead, 0.98x; docs/llm-benchmarks.md, branch q6k23). The same int32.
template <class S, int MR, bool ASYM, int KQ>
constexpr bool fold_offset() { return MR == 1 && KQ == 0 && !ASYM && S::DOT_U8; }
template <int BITS>
constexpr int offset_log2() { return BITS == 8 ? 7 : BITS - 1; }  // QPack::offset(), less S::Q8_SHIFT (0 on VNNI)

// A block's per-lane scales (the W weight rows of slice h, shared by every x row), the start of each x row's int32
// dots (q6_k: its zero offset folded in) and the float epilogue that adds one x row's dot products with the block to
// its accumulator (k_super: the int32 sum of the super-block, add_int). qgemm_mr, qgemm_wide and qgemm_rows all use
// it, so their rows stay bitwise equal. off: the weights' zero offset.
template <class S, bool ASYM, int KQ>
struct BlockScales {
  using V = typename S::V;
  using I = typename S::I;
  V dv = S::zero(), mv = S::zero(), scv = S::zero(), mnv = S::zero(), sd;
  I iclo = S::iset1(0), ichi = S::iset1(0);  // q6_k: its two halves' int8 scales; q4_k / q5_k k_super: sc
  int off;

  BlockScales(const std::uint8_t* rec, int h, const SuperScales<S>& ss, int off_) : sd(ss.sd), off(off_) {
    constexpr int W = S::W;
    if constexpr (KQ == 1 && k_super<S, KQ>()) {  // sc * dot summed in int32 (add_int); the mins: super_mins
      iclo = S::load_u8_i32(rec + W * h);
    } else if (KQ == 0) {
      dv = S::load_f16(rec + 2 * W * h);
      if (ASYM) mv = S::load_f16(rec + 32 + 2 * W * h);
    } else if (KQ == 1) {  // d*sc * dot - dmin*mn * dx*sum(xq)
      scv = u8_scaled<S>(rec + W * h, ss.sd, ss.sd23);
      mnv = u8_scaled<S>(rec + 16 + W * h, ss.smin, ss.smin23);
    } else {  // d * (sc_lo * (dot_lo - 32 sum_lo) + sc_hi * (dot_hi - 32 sum_hi)), see apply
      iclo = S::load_i8_i32(rec + W * h);
      ichi = S::load_i8_i32(rec + 16 + W * h);
    }
  }

  // The values x row block xi's int32 dots start from: q6_k's zero offset (32) times the x sums of the block's two
  // halves, subtracted up front (the same int32 as subtracting it after the dots, two operations fewer in the
  // epilogue); zero for the other formats, whose offset the epilogue subtracts (up front, the x sum's load and
  // broadcast led each record's dot chain: q4_0 decode measured 3-8% slower, docs/llm-benchmarks.md).
  inline void start(I& ilo, I& ihi, const XQ& x, i64 xi) const {
    ilo = ihi = S::iset1(0);
    if (KQ == 2) {
      const std::int32_t slo = x.sl[xi], shi = x.s[xi] - slo;
      ilo = S::iset1(-32 * slo), ihi = S::iset1(-32 * shi);
    }
  }

  // x row block xi's dot products ilo (q6_k: ilo / ihi, the block's two halves), from start(), into facc.
  inline void apply(V& facc, I ilo, I ihi, const XQ& x, i64 xi) const {
    if (KQ == 0) {
      if (off != 0) ilo = S::isub(ilo, S::iset1(off * x.s[xi]));
      facc = S::fma(S::cvt_f(ilo), S::mul(dv, S::set1(x.d[xi])), facc);
      if (ASYM) facc = S::fma(mv, S::set1(x.ds[xi]), facc);
    } else if (KQ == 1) {
      facc = S::fma(S::cvt_f(ilo), S::mul(scv, S::set1(x.d[xi])), facc);
      facc = S::fnma(mnv, S::set1(x.ds[xi]), facc);
    } else {
      // sc_lo * lo + sc_hi * hi summed in int32, then converted: |lo|, |hi| <= 16 * 32 * 127 = 65024 and
      // |sc| <= 128, so the sum (<= 16646144 < 2^24) converts exactly -- the same float as the former float form
      // (fma(cvt hi, sc_hi, cvt lo * sc_lo), exact for the same reason), in 6 operations instead of 8 where vpmulld
      // is one (Zen 4: q6_k's one-row tile 0.96x the time in L2, same bits; on Intel it is two, the same count).
      const V isum = S::cvt_f(S::iadd(S::imul(ihi, ichi), S::imul(ilo, iclo)));
      facc = S::fma(isum, S::mul(sd, S::set1(x.d[xi])), facc);
    }
  }

  // k_super: the block's scaled dot added to the row's super-block sum iacc in int32. Exact: q4_k / q5_k |sc * dot|
  // <= 63 * 32 * 31 * 127, q6_k <= 16646144 (see apply), so 8 blocks stay below 2^31.
  inline void add_int(I& iacc, I ilo, I ihi) const {
    if (KQ == 1) iacc = S::iadd(iacc, S::imul(ilo, iclo));
    else iacc = S::iadd(iacc, S::iadd(S::imul(ihi, ichi), S::imul(ilo, iclo)));
  }
  // q4_k's two chains of the few-row tiles (qgemm_mr's HI16: ihi = 16 x the high nibbles' dot): each half's dot,
  // |.| <= 16 * 15 * 127 < 2^15, is an int16 operand of vpdpwssd with sc, so 3 operations instead of add_int's 2
  // after the chains' combine (2).
  inline void add_int_hi16(I& iacc, I ilo, I ihi) const {
    iacc = S::dot_i16(S::dot_i16(iacc, iclo, ilo), iclo, S::template srai<4>(ihi));
  }
};

// k_super, q4_k / q5_k: the int32 dot of the super-block's mins (rec0: its first record, nblk records) with the x
// sums of its blocks, for x rows xi0 + m * x.nb (m < mr): one vpdpwssd a block and row (block_mins), the x sum (|.|
// <= 32 * 127) read as the int16 low half of its int32. |.| <= 8 * 63 * 32 * 127: exact in float.
template <class S, int KQ, int MR>
inline void block_mins(typename S::I (&imin)[MR], const std::uint8_t* rec, int h, const XQ& x, i64 xi, int mr) {
  const typename S::I mn = S::load_u8_i32(rec + 16 + S::W * h);
  for (int m = 0; m < MR; ++m)
    if (m < mr) imin[m] = S::dot_i16_at(imin[m], mn, x.s + xi + m * x.nb);
}
template <class S, int KQ, int MR>
inline void super_mins(typename S::I (&imin)[MR], const std::uint8_t* rec0, i64 rec_bytes, i64 nblk, int h,
                       const XQ& x, i64 xi0, int mr) {
  for (auto& a : imin) a = S::iset1(0);
  if constexpr (KQ == 1)
    for (i64 j = 0; j < nblk; ++j) block_mins<S, KQ, MR>(imin, rec0 + j * rec_bytes, h, x, xi0 + j, mr);
}

// k_super: a super-block's float step for one x row (xi0: its first block), after its blocks' add_int: the int32
// sum times d * dx, less (q4_k / q5_k) dmin * dx times imin (super_mins). One conversion a super-block and row
// instead of one a block.
template <class S, int KQ>
inline void super_end(typename S::V& facc, typename S::I iacc, typename S::I imin, const SuperScales<S>& ss,
                      const XQ& x, i64 xi0) {
  const typename S::V dx = S::set1(x.d[xi0]);
  facc = S::fma(S::cvt_f(iacc), S::mul(ss.sd, dx), facc);
  if constexpr (KQ == 1) facc = S::fnma(S::cvt_f(imin), S::mul(ss.smin, dx), facc);
}

// What qgemm_mr and qgemm_rows read per super-block and per record besides the quants (one code for both, so
// their rows stay bitwise equal and their prefetch the same).
//
// The d (and dmin) of a k-quant super-block sb for slice h (rows W*h..); zero for other formats.
template <class S, int KQ>
inline SuperScales<S> super_scales(const std::uint8_t* sb, int h) {
  SuperScales<S> ss;
  if (!KQ) return ss;
  const typename S::V two23 = S::set1(8388608.f);
  ss.sd = S::load_f16(sb + 2 * S::W * h);
  if (KQ == 1) {
    ss.smin = S::load_f16(sb + 32 + 2 * S::W * h);
    if constexpr (HasU8Scaled<S>::value && !k_super<S, KQ>())
      ss.sd23 = S::mul(ss.sd, two23), ss.smin23 = S::mul(ss.smin, two23);
  }
  return ss;
}

// The super-block walk of qgemm_mr and qgemm_rows: blocks per super-block, its header bytes and its size. FLAT
// (hetero's 4-bit formats, QPack::sub 1) gets them as constants, so the walk's two loops collapse into one over the
// records (read from w with sub 1, the per-record loop bookkeeping spilled to the stack: q5_0's one-row tile measured
// 1.2x slower than q5_k's in L2; flat, 0.81x; branch q5d13). GGUF q5_0 / q5_1 walk runs of 8 records read from w
// (QPack::sub 8, no header): as fast as flat in L2 and 1.05-1.10x faster streaming from memory (flat: 82-84% of
// the read probe, runs of 8 from w 91%, runs of 8 as constants 86-87%; branch dsm15). Not 8-bit: q8_0's one-row
// tile measured 1.13x slower flat (docs/llm-benchmarks.md, branch q5d13).
template <bool FLAT>
struct SuperWalk {
  i64 sub, hdr, bytes;
  explicit SuperWalk(const QPack& w)
      : sub(FLAT ? 1 : w.sub), hdr(FLAT ? 0 : w.sb_hdr), bytes(FLAT ? w.rec_bytes : w.super_bytes) {}
};

// Prefetch of record rec's lines pf bytes ahead (pf: prefetch_distance<MR>(l2)) into L2 (l2) or L1. The weights stream
// from memory and want more lines in flight than the L2 streamer keeps: decode's 1-2 x rows, and a batched step's 4-8
// too (their tiles took 0.6-0.85x the time with it streaming from memory, benchmarks/qgemm_rows.py,
// docs/serving.md). NT, the block's steps of 64 bytes when known at compile time, makes the line count a constant
// (no loop branch to mispredict); else it is w.rec_bytes / 64, rounded up (the same count).
// Inlined by force, with the traits' prefetch functions, and without a lambda: any of them left out of line (GCC 12,
// a file holding several tiles) was found free of side effects -- a prefetch is none to the compiler -- and every
// call was deleted, so no tile issued a weight prefetch, whatever HETERO_LLM_PF said (objdump of the plugin: no
// prefetcht1 in any qgemm tile before branch dec25; tests/plugins/cpu/test_llm_prefetch_emitted.py).
// The 4/5/6-bit one-row tiles hold no prefetch code: emitted, it cost them 1.24x on the Q4_K_M decode step and its
// test of the distance alone (0 there) the Q4_0 step 4-6% (paired, dec25), as in every measurement from a62fe70 to
// dec25. Their tiles of 2+ rows do (ROWS; branch vt31; distance: prefetch_distance).
template <class S, int BITS, bool ASYM, int KQ, int NT, bool ROWS = false, bool L1 = false>
[[gnu::always_inline]] inline void prefetch_record(const QPack& w, const std::uint8_t* rec, i64 pf, bool l2) {
  if constexpr (BITS != 8 && !ROWS) return;
  if constexpr (L1) l2 = false;  // rows_into_l1
  if (pf == 0) return;  // none (rather than prefetching the lines the tile is about to load)
  // The 64-byte lines of a record of NT steps (QPack::layout: header + quants, 5/6-bit formats' high planes).
  constexpr int LINES = ((KQ || !ASYM ? 32 : 64) + 64 * NT * (BITS == 5 ? 5 : BITS == 6 ? 6 : 4) / 4 + 63) / 64;
  const std::uint8_t* at = rec + pf;
  const i64 lines = NT != 0 ? LINES : (w.rec_bytes + 63) / 64;
  if (l2)
    for (i64 o = 0; o < lines; ++o) S::prefetch_l2(at + 64 * o);
  else
    for (i64 o = 0; o < lines; ++o) S::prefetch(at + 64 * o);
}

// q6_k's one-row tile issues a prefetcht0 of its record's activations (the line of its 32 int8 values,
// HETERO_LLM_XPF bytes ahead: 0 by default, the record's own) at the record's start. Streamed from memory at
// K = 8960 (down_proj), the tile ran 1.14-1.17x the GB/s with it at 1 and 2 threads, level at K = 1536 and in L2
// (the same bits). Why is not understood: not what it fetches -- 64 bytes behind (a line already in L1) gained as
// much (1.16-1.20x), and the same code with the instruction replaced by an empty asm taking its address only
// 1.01-1.06x; 1-2 KiB ahead cost every format 3-28%. The other formats gained nothing consistent (q4_0 1.13-1.17x
// the time in L2, q5_1 streamed 1.04-1.09x with the per-block arrays' lines prefetched too and 0.77-0.83x without,
// q8_0 0.91-0.97x; docs/llm-benchmarks.md, branch dn26). Inlined by force: out of line, GCC deletes a prefetch (see
// prefetch_record).
template <int KQ, int MR, int NT>
constexpr bool prefetch_x_l1() { return MR == 1 && NT != 0 && KQ == 2; }
inline i64 x_prefetch_distance() {
  static const i64 d = env_bytes("HETERO_LLM_XPF", 0);
  return d;
}
template <class S>
[[gnu::always_inline]] inline void prefetch_x(const std::int8_t* xq, i64 ahead) { S::prefetch(xq + ahead); }

// The rows' float sums of a tile: in registers, or (IN_Y) in the y rows, read and written once a super-block --
// q4_k's k_super tiles of 5-8 rows, whose int32 sums, dot chains and decoded weights then keep the registers (8
// rows: 1.25x the float epilogue's time in registers, 1.01-1.03x in y, in L2; in y, q5_k's 8 rows and the 9-16-row
// tiles measured slower, 1.1-1.35x). y is the caller's, so the compiler cannot move it back into registers.
template <class S, int MR, bool IN_Y>
struct RowSums {
  using V = typename S::V;
  V r[IN_Y ? 1 : MR];
  float* y;
  i64 ldy;
  int nv;  // valid lanes of the slice

  RowSums(float* y_, i64 ldy_, int nv_, int mr) : y(y_), ldy(ldy_), nv(nv_) {
    for (int m = 0; m < MR; ++m)
      if (m < mr) set(m, S::zero());
  }
  V get(int m) const {
    if constexpr (IN_Y) return S::load_n(y + m * ldy, nv);
    else return r[m];
  }
  void set(int m, V v) {
    if constexpr (IN_Y) S::store_n(y + m * ldy, v, nv);
    else r[m] = v;
  }
  void store(int mr) const {
    if constexpr (!IN_Y)
      for (int m = 0; m < MR; ++m)
        if (m < mr) S::store_n(y + m * ldy, r[m], nv);
  }
};

// One 16-row group, in slices of W rows, against MR activation rows. BITS: 4/5/6/8; KQ: scale layout (llm.hpp).
// NT: the block's steps of 64 bytes when known at compile time (blocks of 32, every GGUF format: the step loop
// unrolls), else 0 (read from w.bs).
//
// Few rows (MR <= 2): each row's int32 dot of a block is summed in two independent chains (4/5/6-bit weights: the
// low and the high nibbles; 8-bit: the even and the odd steps), added at the end. The dot is the same integer
// whichever way it is summed, so this only shortens the chain of dependent int8 dots (latency 4 cycles each) that
// one row would otherwise wait on; more rows have independent chains already. Where the int8 dot takes unsigned
// bytes of any size (S::DOT_U8: vpdpbusd sums its four products in int32), 4-bit weights split that way also skip
// the shift of the high nibbles: they are dotted in place (16 times their value) and their chain's sum shifted right
// by 4 once.
template <class S, int BITS, bool ASYM, int KQ, int MR, int NT = 0>
void qgemm_mr(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, float* y, i64 ldy, int nvalid) {
  using V = typename S::V;
  using I = typename S::I;
  using B = typename S::B;
  constexpr int W = S::W;
  constexpr bool NIB = BITS < 8;
  constexpr bool SPLIT = MR <= 2 || KQ == 2;  // two dot chains per row (q6_k: its two scaled halves)
  constexpr bool HI16 = SPLIT && BITS == 4 && S::DOT_U8;  // high nibbles dotted in place (x16)
  constexpr bool HI8 = MR == 1 && BITS == 5 && HasFiveBitGf<S>::value;  // 5-bit high values dotted x8 (five_bit_step)
  constexpr int HI_SHIFT = HI16 ? 4 : HI8 ? 3 : 0;
  constexpr bool KS = k_super<S, KQ>();  // the super-block's dots summed in int32 (BlockScales::add_int)
  const int bs = w.bs;
  const int nt = NT ? NT : (NIB ? bs / 8 : bs / 4);
  const int off = BITS == 8 ? w.offset() - S::Q8_SHIFT : w.offset();
  const i64 hdr = w.header_bytes(), nib_bytes = w.nibble_bytes();
  const bool l2 = prefetch_into_l2<MR>(x);
  constexpr bool PF_L1 = rows_into_l1<MR, BITS, KQ>();
  const i64 pf = prefetch_distance<MR, BITS, PF_L1>(l2);
  const SuperWalk<KQ == 0 && BITS == 4> walk(w);
  // The one-row tile's mins (q4_k / q5_k, k_super): each block's dot in the record loop (block_mins), not in a
  // second pass over the super-block's records after it (super_mins): the same int32, one loop fewer a super-block
  // (in L1, the one-row q4_k tile 0.985-0.989x the time, q5_k 0.975; a pass of its own ran 9% of q4_k's time).
  constexpr bool MINS_IN = KS && KQ == 1 && MR == 1;
  constexpr bool FOLD = fold_offset<S, MR, ASYM, KQ>();  // the offset subtracted as a shifted x sum (see there)
  constexpr bool XPF = prefetch_x_l1<KQ, MR, NT>();  // the activations' L1 prefetch (prefetch_x)
  const i64 xpf = XPF ? x_prefetch_distance() : 0;
  const B nib = S::bset8(0x0f), nibhi = S::bset8(0xf0);
  const std::int8_t* xrow[MR];
  for (int m = 0; m < MR; ++m) xrow[m] = x.q + (m0 + m) * x.ldq;
  for (int h = 0; h < QR / W; ++h) {
    RowSums<S, MR, (KS && BITS == 4 && MR > 4)> facc(y + W * h, ldy, nvalid - W * h, MR);
    const std::uint8_t* sb = group;  // the super-block of b0 (a record when KQ == 0)
    for (i64 b0 = 0; b0 < w.nb; b0 += walk.sub, sb += walk.bytes) {
      const SuperScales<S> ss = super_scales<S, KQ>(sb, h);  // k-quants: the super-block's d (and dmin)
      const i64 b1 = std::min<i64>(w.nb, b0 + walk.sub);
      I iacc[KS ? MR : 1], imin[KS && KQ == 1 ? MR : 1];
      for (I& a : iacc) a = S::iset1(0);
      for (I& a : imin) a = S::iset1(0);
      for (i64 b = b0; b < b1; ++b) {
        const std::uint8_t* rec = sb + walk.hdr + (b - b0) * w.rec_bytes;
        const std::uint8_t* qv = rec + hdr;
        if (h == 0) prefetch_record<S, BITS, ASYM, KQ, NT, (MR >= 2), PF_L1>(w, rec, pf, l2);
        if constexpr (XPF) prefetch_x<S>(xrow[0] + b * bs, xpf);
        const BlockScales<S, ASYM, KQ> scales(rec, h, ss, FOLD ? 0 : off);
        if constexpr (MINS_IN) block_mins<S, KQ, MR>(imin, rec, h, x, m0 * x.nb + b, MR);
        I ilo[MR], ihi[MR];  // q6_k keeps the block's two halves apart (one scale each)
        for (int m = 0; m < MR; ++m) scales.start(ilo[m], ihi[m], x, (m0 + m) * x.nb + b);
        const i64 xo = b * bs;
        auto step = [&](int t) {
          const B v0 = S::load_b(qv + 64 * t + 4 * W * h);
          const B v = NIB ? S::opaque(v0) : v0;  // nibbles: one load for both masks
          if (NIB) {
            B lo, hi;
            if constexpr (BITS == 6 && MR == 1 && HasSixBitGf<S>::value) {
              S::six_bit_step(v, S::opaque(S::load_b(qv + nib_bytes + 64 * (t / 2) + 4 * W * h)), t % 2, lo, hi);
            } else if constexpr (HI8) {
              S::five_bit_step(v, S::opaque(S::load_b(qv + nib_bytes + 4 * W * h)), t, lo, hi);
            } else if constexpr (HI16) {
              lo = S::band(v, nib), hi = S::band(v, nibhi);
            } else {
              unpack_step<S, BITS>(v, qv + nib_bytes, t, h, lo, hi);
            }
            for (int m = 0; m < MR; ++m) {
              const std::int8_t* xp = xrow[m] + xo + 8 * t;  // pair4: the low nibbles' 4 bytes, then the high ones'
              if (SPLIT) {
                ilo[m] = dot4_at<S>(ilo[m], lo, xp);
                ihi[m] = dot4_at<S>(ihi[m], hi, xp + 4);
              } else {  // values <= 31
                ilo[m] = dot4x2_at<S>(ilo[m], lo, xp, hi, xp + 4);
              }
            }
          } else {
            const typename S::Q8 wq = S::q8_weights(v);
            for (int m = 0; m < MR; ++m) {  // SPLIT: even steps into ilo, odd into ihi
              I& acc = SPLIT && (t & 1) ? ihi[m] : ilo[m];
              acc = dot_q8_at<S>(acc, wq, xrow[m] + xo + 4 * t);
            }
          }
        };
        if constexpr (NT != 0) {
#pragma GCC unroll 8
          for (int t = 0; t < NT; ++t) step(t);
        } else {
          for (int t = 0; t < nt; ++t) step(t);  // not unrolled (see qgemm_tile)
        }
        if constexpr (KS && HI16) {
          for (int m = 0; m < MR; ++m) scales.add_int_hi16(iacc[m], ilo[m], ihi[m]);
        } else {
          if (SPLIT && KQ != 2)  // |16 * dot| <= 16 * 32 * 15 * 127: no overflow, and the shift is exact
            for (int m = 0; m < MR; ++m)
              ilo[m] = S::iadd(ilo[m], HI_SHIFT ? S::template srai<HI_SHIFT>(ihi[m]) : ihi[m]);
          if constexpr (FOLD)
            ilo[0] = S::isub(ilo[0], S::template slli<offset_log2<BITS>()>(S::iset1(x.s[m0 * x.nb + b])));
          for (int m = 0; m < MR; ++m) {
            if constexpr (KS) scales.add_int(iacc[m], ilo[m], ihi[m]);
            else scales.apply(facc.r[m], ilo[m], ihi[m], x, (m0 + m) * x.nb + b);
          }
        }
      }
      if constexpr (KS) {
        if constexpr (!MINS_IN) super_mins<S, KQ>(imin, sb + walk.hdr, w.rec_bytes, b1 - b0, h, x, m0 * x.nb + b0, MR);
        for (int m = 0; m < MR; ++m) {
          V f = facc.get(m);
          super_end<S, KQ>(f, iacc[m], imin[KQ == 1 ? m : 0], ss, x, (m0 + m) * x.nb + b0);
          facc.set(m, f);
        }
      }
    }
    facc.store(MR);
  }
}

// One tile of MR rows. Blocks of 32 (every GGUF format) with the step loop unrolled where that measured faster:
// 1-2 rows (decode) of every format, and q6_k; 3-8 rows of the others keep the loop (unrolled, the 8-bit tiles ran
// 10-20% slower on AVX2 / AVX-512, their registers spilling). 8-bit 1-2 rows, unrolled in two chains, were 20% faster
// from L2 but 1.2-1.4x slower streaming from DRAM on the AMD machine of 2026-12-02 (busy, not understood); on the
// Intel Xeon of 2026-12-03 they are 1.1-1.25x faster from L2 and paired decode of a Q8_0 file is not slower
// (docs/llm-benchmarks.md, branch dec8), so they unroll too.
template <class S, int BITS, bool ASYM, int KQ, int MR>
void qgemm_tile(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, float* y, i64 ldy, int nvalid) {
  if constexpr (MR <= 2 || KQ == 2) {
    if (w.bs == 32) return qgemm_mr<S, BITS, ASYM, KQ, MR, BITS < 8 ? 4 : 8>(w, group, x, m0, y, ldy, nvalid);
  }
  qgemm_mr<S, BITS, ASYM, KQ, MR>(w, group, x, m0, y, ldy, nvalid);
}

// Tiles of 9-16 rows (a speculative verify step's k + 1; S::QGEMM_ROWS) where the int8 dot takes unsigned bytes
// of any size (S::DOT_U8: vpdpbusd) and blocks are 32: each block's weights are decoded into registers once (4/5/6-
// bit: its 4 steps' low and high nibbles; 8-bit: its 8 steps as stored), then every row takes its int32 dot of the
// whole block (one chain; q6_k: its two halves) and the float epilogue, row after row. Two 8-row tiles (the
// row-interleaved qgemm_mr, whose registers hold 8 rows' accumulators) decoded every block twice and paid the
// tile's per-block cost (decode, scales, prefetch, loop) twice (from L2, q6_k 9 / 12 rows: 4.19 / 5.24 one-row
// GEMVs as 8 + the rest, 3.83 / 4.65 wide; q8_0 3.80 / 4.73 against 2.84 / 3.82; docs/speculative.md). Rows
// mr..MR-1 are skipped (a branch the same every block). Each row's int32 dot is
// the same integer as the one-row tile's and its epilogue the same operations in the same order (BlockScales), so
// every row is bitwise the one-row GEMV.
template <class S, int BITS, bool ASYM, int KQ, int MR>
void qgemm_wide(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
                int nvalid) {
  using V = typename S::V;
  using I = typename S::I;
  using B = typename S::B;
  constexpr int W = S::W;
  constexpr bool NIB = BITS < 8;
  constexpr int NT = NIB ? 4 : 8;  // steps of 64 bytes per block of 32
  constexpr bool KS = k_super<S, KQ>();  // as qgemm_mr
  const int off = BITS == 8 ? w.offset() - S::Q8_SHIFT : w.offset();
  const i64 hdr = w.header_bytes(), nib_bytes = w.nibble_bytes();
  const bool l2 = prefetch_into_l2<MR>(x);
  const i64 pf = prefetch_distance<MR, BITS>(l2);
  const SuperWalk<KQ == 0 && BITS == 4> walk(w);
  for (int h = 0; h < QR / W; ++h) {
    RowSums<S, MR, false> facc(y + W * h, ldy, nvalid - W * h, mr);
    const std::uint8_t* sb = group;
    for (i64 b0 = 0; b0 < w.nb; b0 += walk.sub, sb += walk.bytes) {
      const SuperScales<S> ss = super_scales<S, KQ>(sb, h);
      const i64 b1 = std::min<i64>(w.nb, b0 + walk.sub);
      I iacc[KS ? MR : 1];
      for (I& a : iacc) a = S::iset1(0);
      for (i64 b = b0; b < b1; ++b) {
        const std::uint8_t* rec = sb + walk.hdr + (b - b0) * w.rec_bytes;
        const std::uint8_t* qv = rec + hdr;
        if (h == 0) prefetch_record<S, BITS, ASYM, KQ, NT, (MR >= 2)>(w, rec, pf, l2);
        const BlockScales<S, ASYM, KQ> scales(rec, h, ss, off);
        B lo[NT], hi[NIB ? NT : 1];
        for (int t = 0; t < NT; ++t) {
          const B v = S::load_b(qv + 64 * t + 4 * W * h);
          if (NIB) {
            unpack_step<S, BITS>(S::opaque(v), qv + nib_bytes, t, h, lo[t], hi[t]);
          } else {
            lo[t] = v;
          }
        }
        const i64 xo = b * 32;
        for (int m = 0; m < MR; ++m) {
          if (m >= mr) break;
          const i64 xi = (m0 + m) * x.nb + b;
          const std::int8_t* xr = x.q + (m0 + m) * x.ldq + xo;
          I ilo, ihi;
          scales.start(ilo, ihi, x, xi);
          for (int t = 0; t < NT; ++t) {
            if (NIB) {  // pair4: the low nibbles' 4 activation bytes, then the high ones'
              ilo = dot4_at<S>(ilo, lo[t], xr + 8 * t);
              I& acc = KQ == 2 ? ihi : ilo;
              acc = dot4_at<S>(acc, hi[t], xr + 8 * t + 4);
            } else {
              ilo = dot_q8_at<S>(ilo, S::q8_weights(lo[t]), xr + 4 * t);
            }
          }
          if constexpr (KS) scales.add_int(iacc[m], ilo, ihi);
          else scales.apply(facc.r[m], ilo, ihi, x, xi);
        }
      }
      if constexpr (KS) {
        I imin[KQ == 1 ? MR : 1];
        super_mins<S, KQ>(imin, sb + walk.hdr, w.rec_bytes, b1 - b0, h, x, m0 * x.nb + b0, mr);
        for (int m = 0; m < MR; ++m) {
          if (m >= mr) break;
          V f = facc.get(m);
          super_end<S, KQ>(f, iacc[m], imin[KQ == 1 ? m : 0], ss, x, (m0 + m) * x.nb + b0);
          facc.set(m, f);
        }
      }
    }
    facc.store(mr);
  }
}

// qgemm_tile for mr in [1, R] rows (R = S::QGEMM_MR).
template <class S, int BITS, bool ASYM, int KQ>
void qgemm_mr_fmt(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
                  int nvalid) {
  constexpr int R = S::QGEMM_MR;
  switch (mr) {
    case 1: qgemm_tile<S, BITS, ASYM, KQ, 1>(w, group, x, m0, y, ldy, nvalid); break;
    case 2: qgemm_tile<S, BITS, ASYM, KQ, std::min(2, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 3: qgemm_tile<S, BITS, ASYM, KQ, std::min(3, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 4: qgemm_tile<S, BITS, ASYM, KQ, std::min(4, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 5: qgemm_tile<S, BITS, ASYM, KQ, std::min(5, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 6: qgemm_tile<S, BITS, ASYM, KQ, std::min(6, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 7: qgemm_tile<S, BITS, ASYM, KQ, std::min(7, R)>(w, group, x, m0, y, ldy, nvalid); break;
    default: qgemm_tile<S, BITS, ASYM, KQ, std::min(8, R)>(w, group, x, m0, y, ldy, nvalid); break;
  }
}

#include "llm_qgemm_rows.hpp"  // qgemm_rows: tiles of 2+ rows on vpmaddubsw ISAs

template <class S, int BITS, bool ASYM, int KQ>
void qgemm_fmt(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
               int nvalid) {
  if (mr > S::QGEMM_MR) {  // 9-16 rows (QGEMM_ROWS > QGEMM_MR: VNNI), see qgemm_wide
    if constexpr (S::DOT_U8) {
      if (w.bs == 32) {
        // 4/5-bit formats up to 12 rows: the row-interleaved tile still fits its accumulators in the 32 registers
        // and took 0.91-0.95x the wide tile's time at 9 / 11 / 12 rows (q4_k, q4_0, q5_0 in L2) -- but not q5_1 at
        // 12 rows (spilled: 9.8x a one-row GEMV, the wide tile 5.7x, branch dec22), nor the k_super tiles (q4_k /
        // q5_k on VNNI: the int32 sums of 9-12 rows besides the chains spilled, 1.35x at 9 and 12 rows; the wide
        // tile ~1.02x the float epilogue's row-interleaved one). q6_k (two chains per row), 8-bit (as fast either
        // way) and 13-16 rows take the wide tile.
        if constexpr (BITS < 8 && KQ != 2 && !k_super<S, KQ>()) {
          switch (mr) {
            case 9: return qgemm_mr<S, BITS, ASYM, KQ, 9>(w, group, x, m0, y, ldy, nvalid);
            case 10: return qgemm_mr<S, BITS, ASYM, KQ, 10>(w, group, x, m0, y, ldy, nvalid);
            case 11: return qgemm_mr<S, BITS, ASYM, KQ, 11>(w, group, x, m0, y, ldy, nvalid);
            case 12:
              if (BITS == 5 && ASYM) break;  // q5_1
              return qgemm_mr<S, BITS, ASYM, KQ, 12>(w, group, x, m0, y, ldy, nvalid);
            default: break;
          }
        }
        if (mr <= 12) return qgemm_wide<S, BITS, ASYM, KQ, 12>(w, group, x, m0, mr, y, ldy, nvalid);
        // k_super q4_k / q5_k: 13-16 rows as 8 + the rest (below): the wide tile's int32 and float sums of 16 rows
        // spilled (1.09-1.12x the float epilogue's wide tile in L2; 8 + the rest 1.0x)
        if (!(k_super<S, KQ>() && KQ == 1))
          return qgemm_wide<S, BITS, ASYM, KQ, 16>(w, group, x, m0, mr, y, ldy, nvalid);
      }
    }
    for (int m = 0; m < mr; m += S::QGEMM_MR)
      qgemm_fmt<S, BITS, ASYM, KQ>(w, group, x, m0 + m, std::min(mr - m, S::QGEMM_MR), y + m * ldy, ldy, nvalid);
    return;
  }
  if constexpr (HasAcc16<S>::value && BITS < 8) {
    if (mr >= 2 && rows_kernel_fits(w)) return qgemm_rows_fmt<S, BITS, ASYM, KQ>(w, group, x, m0, mr, y, ldy, nvalid);
  }
  qgemm_mr_fmt<S, BITS, ASYM, KQ>(w, group, x, m0, mr, y, ldy, nvalid);
}

template <class S>
void qgemm_group(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
                 int nvalid) {
  decltype(&qgemm_fmt<S, 4, false, 0>) f;
  switch (w.kq) {
    case 1: f = w.bits == 4 ? qgemm_fmt<S, 4, true, 1> : qgemm_fmt<S, 5, true, 1>; break;  // q4_k / q5_k
    case 2: f = qgemm_fmt<S, 6, false, 2>; break;                                          // q6_k
    default:
      if (w.bits == 4) f = w.asym ? qgemm_fmt<S, 4, true, 0> : qgemm_fmt<S, 4, false, 0>;
      else if (w.bits == 5) f = w.asym ? qgemm_fmt<S, 5, true, 0> : qgemm_fmt<S, 5, false, 0>;  // q5_1 / q5_0
      else f = w.asym ? qgemm_fmt<S, 8, true, 0> : qgemm_fmt<S, 8, false, 0>;
  }
  f(w, group, x, m0, mr, y, ldy, nvalid);
}

// ---------------------------------------------------------------------------------------------- float GEMM
template <class S, int WT>
inline typename S::V loadw(const void* w, i64 i) {
  if (WT == W_F32) return S::load(static_cast<const float*>(w) + i);
  if (WT == W_F16) return S::load_f16(static_cast<const std::uint16_t*>(w) + i);
  return S::load_bf16(static_cast<const std::uint16_t*>(w) + i);
}

template <int WT>
inline float loadw1(const void* w, i64 i) {
  if (WT == W_F32) return static_cast<const float*>(w)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(w)[i];
  return WT == W_F16 ? half_to_float(h) : bf16_to_float(h);
}

// MR x rows against 4 weight rows; the last k % W elements in scalar after the lanes are summed.
template <class S, int WT, int MR>
void fgemm_mr(const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, float* y, i64 ldy) {
  using V = typename S::V;
  constexpr int NW = 4;
  V acc[MR][NW];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NW; ++j) acc[m][j] = S::zero();
  i64 wo[NW];
  for (int j = 0; j < NW; ++j) wo[j] = (j < nrows ? j : nrows - 1) * ldw;
  i64 i = 0;
  for (; i + S::W <= k; i += S::W) {
    V wv[NW];
    for (int j = 0; j < NW; ++j) wv[j] = loadw<S, WT>(w, wo[j] + i);
    for (int m = 0; m < MR; ++m) {
      const V xv = S::load(x + m * ldx + i);
      for (int j = 0; j < NW; ++j) acc[m][j] = S::fma(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < nrows; ++j) {
      float r = S::hsum(acc[m][j]);
      for (i64 t = i; t < k; ++t) r += x[m * ldx + t] * loadw1<WT>(w, wo[j] + t);
      y[m * ldy + j] = r;
    }
}

template <class S, int WT>
void fgemm_wt(const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y, i64 ldy) {
  constexpr int R = S::FGEMM_MR;
  for (int m0 = 0; m0 < mr; m0 += R) {
    const float* xm = x + m0 * ldx;
    float* ym = y + m0 * ldy;
    switch (std::min(mr - m0, R)) {
      case 1: fgemm_mr<S, WT, 1>(w, ldw, nrows, k, xm, ldx, ym, ldy); break;
      case 2: fgemm_mr<S, WT, std::min(2, R)>(w, ldw, nrows, k, xm, ldx, ym, ldy); break;
      case 3: fgemm_mr<S, WT, std::min(3, R)>(w, ldw, nrows, k, xm, ldx, ym, ldy); break;
      default: fgemm_mr<S, WT, std::min(4, R)>(w, ldw, nrows, k, xm, ldx, ym, ldy); break;
    }
  }
}

template <class S>
void fgemm_tile(int wt, const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y,
                i64 ldy) {
  if (wt == W_F16) fgemm_wt<S, W_F16>(w, ldw, nrows, k, x, ldx, mr, y, ldy);
  else if (wt == W_BF16) fgemm_wt<S, W_BF16>(w, ldw, nrows, k, x, ldx, mr, y, ldy);
  else fgemm_wt<S, W_F32>(w, ldw, nrows, k, x, ldx, mr, y, ldy);
}

// ---------------------------------------------------------------------------------------------- conversions
template <class S>
void f16_to_f32(const std::uint16_t* src, float* dst, i64 n) {
  i64 i = 0;
  for (; i + S::W <= n; i += S::W) S::store(dst + i, S::load_f16(src + i));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

template <class S>
void f32_to_f16(const float* src, std::uint16_t* dst, i64 n) {
  i64 i = 0;
  for (; i + S::W <= n; i += S::W) S::store_f16(dst + i, S::load(src + i));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// ---------------------------------------------------------------------------------------------- attention
// W cached K/V elements as float (q8: the int8 values, before their block scale); one in scalar.
template <class S, int K>
inline typename S::V loadkv(const void* p, i64 i) {
  if (K == KV_F16) return S::load_f16(static_cast<const std::uint16_t*>(p) + i);
  if (K == KV_Q8) return S::load_i8(static_cast<const std::int8_t*>(p) + i);
  return S::load(static_cast<const float*>(p) + i);
}

template <int K>
inline float loadkv1(const void* p, i64 i) {
  if (K == KV_F16) return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
  if (K == KV_Q8) return static_cast<float>(static_cast<const std::int8_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Two lines of `a` into L2 (the next range once one is done); nothing once they are all issued.
template <class S>
inline void kv_ahead(KvAhead& a) {
  if (a.cur >= a.end) {
    if (a.runs <= 0) return;
    a.base += a.stride;
    a.cur = a.base;
    a.end = a.base + (--a.runs == 0 ? a.last : a.len);
  }
  S::prefetch_l2(a.cur);
  S::prefetch_l2(a.cur + 64);
  a.cur += 128;
}

// NR rows x the tile's 64 positions, 4 key vectors (4W positions) per pass. q8 keys are dequantized in registers
// (int8 -> float times the block's scale, a memory operand from L1); memory traffic, not these extra
// instructions, bounds decode.
template <class S, int K, int NR>
void qk_nr(const float* q, i64 ldq, const void* kt, i64 d, float scale, float* s, i64 lds, KvAhead* ahead) {
  using V = typename S::V;
  constexpr int NV = 4, SPAN = NV * S::W;
  static_assert(KT % SPAN == 0, "a pass covers part of a K tile");
  const float* ks = reinterpret_cast<const float*>(static_cast<const std::int8_t*>(kt) + d * KT);  // q8 only
  for (int p0 = 0; p0 < KT; p0 += SPAN) {
    V acc[NR][NV];
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < NV; ++j) acc[r][j] = S::zero();
    for (i64 i = 0; i < d; ++i) {
      if (ahead) kv_ahead<S>(*ahead);
      V kv[NV];
      for (int j = 0; j < NV; ++j) {
        kv[j] = loadkv<S, K>(kt, i * KT + p0 + S::W * j);
        if (K == KV_Q8) kv[j] = S::mul(kv[j], S::load(ks + (i / KVB) * KT + p0 + S::W * j));
      }
      for (int r = 0; r < NR; ++r) {
        const V qb = S::set1(q[r * ldq + i]);
        for (int j = 0; j < NV; ++j) acc[r][j] = S::fma(qb, kv[j], acc[r][j]);
      }
    }
    const V vs = S::set1(scale);
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < NV; ++j) S::store(s + r * lds + p0 + S::W * j, S::mul(acc[r][j], vs));
  }
}

template <class S, int K>
void qk_t(const float* q, i64 ldq, int nr, const void* kt, i64 d, float scale, float* s, i64 lds, KvAhead* ahead) {
  constexpr int R = S::QK_NR;
  for (int r0 = 0; r0 < nr; r0 += R) {
    const float* qr = q + r0 * ldq;
    float* sr = s + r0 * lds;
    switch (std::min(nr - r0, R)) {
      case 1: qk_nr<S, K, 1>(qr, ldq, kt, d, scale, sr, lds, ahead); break;
      case 2: qk_nr<S, K, std::min(2, R)>(qr, ldq, kt, d, scale, sr, lds, ahead); break;
      case 3: qk_nr<S, K, std::min(3, R)>(qr, ldq, kt, d, scale, sr, lds, ahead); break;
      default: qk_nr<S, K, std::min(4, R)>(qr, ldq, kt, d, scale, sr, lds, ahead); break;
    }
  }
}

template <class S>
void qk_tile(const float* q, i64 ldq, int nr, const void* ktile, int kind, i64 d, float scale, float* s, i64 lds,
             KvAhead* ahead) {
  switch (kind) {
    case KV_F16: qk_t<S, KV_F16>(q, ldq, nr, ktile, d, scale, s, lds, ahead); break;
    case KV_Q8: qk_t<S, KV_Q8>(q, ldq, nr, ktile, d, scale, s, lds, ahead); break;
    default: qk_t<S, KV_F32>(q, ldq, nr, ktile, d, scale, s, lds, ahead); break;
  }
}

// NV vectors of o (NV*W values of d, from c) x NR rows of accumulators over the nk positions. c is a multiple
// of NV*W and NV*W and KVB are powers of two, so vector j lies in q8 block c/KVB + W*j/KVB (shared scales are
// loaded once).
template <class S, int K, int NR, int NV>
inline void pv_chunk(const float* p, i64 ldp, const void* v, const float* vscale, i64 nk, i64 d, i64 nb, i64 c,
                     const float* corr, float* o, KvAhead* ahead) {
  using V = typename S::V;
  constexpr int W = S::W;
  static_assert((NV * W & (NV * W - 1)) == 0 && (KVB & (KVB - 1)) == 0, "powers of two");
  V acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = S::mul(S::load(o + r * d + c + W * j), S::set1(corr[r]));
  for (i64 l = 0; l < nk; ++l) {
    if (ahead) kv_ahead<S>(*ahead);
    V vv[NV];
    for (int j = 0; j < NV; ++j) {
      vv[j] = loadkv<S, K>(v, l * d + c + W * j);
      if (K == KV_Q8) vv[j] = S::mul(vv[j], S::set1(vscale[l * nb + c / KVB + W * j / KVB]));
    }
    for (int r = 0; r < NR; ++r) {
      const V pb = S::set1(p[r * ldp + l]);
      for (int j = 0; j < NV; ++j) acc[r][j] = S::fma(pb, vv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NV; ++j) S::store(o + r * d + c + W * j, acc[r][j]);
}

template <class S, int K, int NR>
void pv_nr(const float* p, i64 ldp, const void* v, const float* vscale, i64 nk, i64 d, const float* corr, float* o,
           KvAhead* ahead) {
  constexpr int NV = S::PV_VECS, W = S::W;
  const i64 nb = (d + KVB - 1) / KVB;
  i64 c = 0;
  for (; c + NV * W <= d; c += NV * W) pv_chunk<S, K, NR, NV>(p, ldp, v, vscale, nk, d, nb, c, corr, o, ahead);
  for (; c + W <= d; c += W) pv_chunk<S, K, NR, 1>(p, ldp, v, vscale, nk, d, nb, c, corr, o, ahead);
  for (; c < d; ++c)
    for (int r = 0; r < NR; ++r) {
      float a = o[r * d + c] * corr[r];
      for (i64 l = 0; l < nk; ++l) {
        float vv = loadkv1<K>(v, l * d + c);
        if (K == KV_Q8) vv *= vscale[l * nb + c / KVB];
        a += p[r * ldp + l] * vv;
      }
      o[r * d + c] = a;
    }
}

template <class S, int K>
void pv_t(const float* p, i64 ldp, int nr, const void* v, const float* vscale, i64 nk, i64 d, const float* corr,
          float* o, KvAhead* ahead) {
  switch (nr) {
    case 1: pv_nr<S, K, 1>(p, ldp, v, vscale, nk, d, corr, o, ahead); break;
    case 2: pv_nr<S, K, 2>(p, ldp, v, vscale, nk, d, corr, o, ahead); break;
    case 3: pv_nr<S, K, 3>(p, ldp, v, vscale, nk, d, corr, o, ahead); break;
    default: pv_nr<S, K, 4>(p, ldp, v, vscale, nk, d, corr, o, ahead); break;
  }
}

template <class S>
void pv_tile(const float* p, i64 ldp, int nr, const void* v, int kind, const float* vscale, i64 nk, i64 d,
             const float* corr, float* o, KvAhead* ahead) {
  switch (kind) {
    case KV_F16: pv_t<S, KV_F16>(p, ldp, nr, v, vscale, nk, d, corr, o, ahead); break;
    case KV_Q8: pv_t<S, KV_Q8>(p, ldp, nr, v, vscale, nk, d, corr, o, ahead); break;
    default: pv_t<S, KV_F32>(p, ldp, nr, v, vscale, nk, d, corr, o, ahead); break;
  }
}

// LlmKernels::argmax: a max over whole vectors (NaN checked per vector: it is rare, and numpy's answer is then the
// first NaN), then the first index holding that max (-0 == +0, as numpy compares).
template <class S>
i64 argmax(const float* y, i64 n, float* best) {
  using V = typename S::V;
  constexpr int W = S::W;
  const i64 nv = n / W * W;
  float m = y[0];
  bool nan = m != m;
  if (!nan && nv > 0) {
    V vm = S::load(y);
    for (i64 i = 0; i < nv; i += W) {
      const V v = S::load(y + i);
      if (S::any(S::isnan(v))) {
        nan = true;
        break;
      }
      vm = S::max(vm, v);
    }
    if (!nan) m = S::hmax(vm);
  }
  for (i64 i = nv; i < n && !nan; ++i) {
    if (y[i] != y[i]) nan = true;
    else if (y[i] > m) m = y[i];
  }
  if (nan) {
    for (i64 i = 0; i < n; ++i)
      if (y[i] != y[i]) {
        *best = y[i];
        return i;
      }
  }
  *best = m;
  i64 i = 0;
  const V vm = S::set1(m);
  while (i < nv && !S::any(S::eq(S::load(y + i), vm))) i += W;
  while (y[i] != m) ++i;  // found within this vector, or in the tail (m is one of the values)
  return i;
}

template <class S>
constexpr LlmKernels llm_table(const char* name) {
  return {name,          S::QGEMM_ROWS,   HasKSuper<S>::value, quantize_x<S>, qgemm_group<S>, fgemm_tile<S>,
          f16_to_f32<S>, f32_to_f16<S>, qk_tile<S>,          pv_tile<S>,           argmax<S>};
}

}  // namespace
