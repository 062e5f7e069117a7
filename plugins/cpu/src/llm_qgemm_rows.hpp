// The quantized GEMM of a few activation rows (2 <= M <= the table's max_mr: a speculative verify step, a batch of
// decode slots) on ISAs whose int8 dot is vpmaddubsw + vpmaddwd (AVX2, AVX-512 without VNNI). Included by
// llm_impl.hpp; qgemm_fmt sends such tiles here instead of qgemm_mr.
//
// Why a second kernel: qgemm_mr already decodes each weight block once per tile of rows, but then every row pays
// a vpmaddwd + vpaddd per 4-byte step to widen its int16 pair sums to int32. Here each 16-row block is decoded
// once into a small array (registers or L1) and each row sums its vpmaddubsw products in int16 across several steps
// -- as many as cannot overflow -- before one vpmaddwd: about a third fewer instructions per extra row, which is
// what a verify step of k tokens pays on top of a decode step. The int32 dot of each (row, block) is the same
// integer as qgemm_mr's and the float epilogue the same operations in the same order, so every output is bitwise
// that of qgemm_mr with one row (tested against M = 1 for every format).
//
// int16 bounds (|x| <= 127 after quantize_x): one vpmaddubsw lane is w0*x0 + w1*x1 <= 2 * wmax * 127 and never
// saturates; 4-bit (w <= 15): 8 products (4 steps, low + high nibble) <= 30480; 5-bit (w <= 31): 4 (2 steps)
// <= 31496; q6_k (w <= 63, its halves apart): 2 per half (2 steps) <= 32004. All below 32767.
//
// Included by llm_impl.hpp inside its anonymous namespace (after qgemm_mr and unpack_step).
#pragma once

// S::ACC16: the traits provide dot16 (int16 lanes += vpmaddubsw) and widen16 (int16 pairs -> int32).
template <class S, class = void>
struct HasAcc16 : std::false_type {};
template <class S>
struct HasAcc16<S, std::enable_if_t<S::ACC16>> : std::true_type {};

// Blocks of 32 (every GGUF format, hetero's *_b32): the block's 4 steps x 2 nibble vectors stay in registers with
// indices known at compile time (a run-time count made GCC shuffle the array through the stack, slower than
// qgemm_mr). Other block sizes keep qgemm_mr.
constexpr int ROWS_NT = 4;

inline bool rows_kernel_fits(const QPack& w) { return w.bits < 8 && w.bs == 8 * ROWS_NT; }

// One 16-row group against MR activation rows (see the file comment); the arguments are qgemm_mr's.
template <class S, int BITS, bool ASYM, int KQ, int MR>
void qgemm_rows(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, float* y, i64 ldy, int nvalid) {
  using V = typename S::V;
  using I = typename S::I;
  using B = typename S::B;
  constexpr int W = S::W;
  constexpr int TC = BITS == 4 ? 4 : 2;  // steps summed in int16 before widening (bounds above)
  constexpr int nt = ROWS_NT;
  const int off = w.offset();
  const i64 hdr = w.header_bytes(), nib_bytes = w.nibble_bytes();
  const bool l2 = prefetch_into_l2<MR>(x);
  const i64 pf = prefetch_distance<MR, BITS>(l2);
  const SuperWalk<KQ == 0 && BITS == 4> walk(w);  // as qgemm_mr
  const B zero16 = S::bset8(0);
  const std::int8_t* xrow[MR];
  for (int m = 0; m < MR; ++m) xrow[m] = x.q + (m0 + m) * x.ldq;
  for (int h = 0; h < QR / W; ++h) {
    V facc[MR];
    for (int m = 0; m < MR; ++m) facc[m] = S::zero();
    const std::uint8_t* sb = group;  // as qgemm_mr
    for (i64 b0 = 0; b0 < w.nb; b0 += walk.sub, sb += walk.bytes) {
      const SuperScales<S> ss = super_scales<S, KQ>(sb, h);
      const i64 b1 = std::min<i64>(w.nb, b0 + walk.sub);
      for (i64 b = b0; b < b1; ++b) {
        const std::uint8_t* rec = sb + walk.hdr + (b - b0) * w.rec_bytes;
        const std::uint8_t* qv = rec + hdr;
        if (h == 0) prefetch_record<S, BITS, ASYM, KQ, nt, true>(w, rec, pf, l2);  // as qgemm_mr
        B wlo[nt], whi[nt];
        for (int t = 0; t < nt; ++t) {  // the block's W rows decoded once for all MR x rows
          unpack_step<S, BITS>(S::load_b(qv + 64 * t + 4 * W * h), qv + nib_bytes, t, h, wlo[t], whi[t]);
        }
        const BlockScales<S, ASYM, KQ> scales(rec, h, ss, off);  // shared by the x rows
        const i64 xo = b * 8 * nt;
        for (int m = 0; m < MR; ++m) {
          const std::int8_t* xb = xrow[m] + xo;
          I ilo, ihi;
          scales.start(ilo, ihi, x, (m0 + m) * x.nb + b);
          for (int t0 = 0; t0 < nt; t0 += TC) {
            B alo = zero16, ahi = zero16;
            for (int t = t0; t < t0 + TC; ++t) {
              const B xlo = S::bcast4(xb + 8 * t), xhi = S::bcast4(xb + 8 * t + 4);  // pair4 order
              alo = S::dot16(alo, wlo[t], xlo);
              if (KQ == 2) ahi = S::dot16(ahi, whi[t], xhi);
              else alo = S::dot16(alo, whi[t], xhi);
            }
            ilo = S::iadd(ilo, S::widen16(alo));
            if (KQ == 2) ihi = S::iadd(ihi, S::widen16(ahi));
          }
          scales.apply(facc[m], ilo, ihi, x, (m0 + m) * x.nb + b);
        }
      }
    }
    for (int m = 0; m < MR; ++m) S::store_n(y + m * ldy + W * h, facc[m], nvalid - W * h);
  }
}

// qgemm_rows for mr in [2, R] rows (R = S::QGEMM_MR).
template <class S, int BITS, bool ASYM, int KQ>
void qgemm_rows_fmt(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
                    int nvalid) {
  constexpr int R = S::QGEMM_MR;
  switch (mr) {
    case 2: qgemm_rows<S, BITS, ASYM, KQ, std::min(2, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 3: qgemm_rows<S, BITS, ASYM, KQ, std::min(3, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 4: qgemm_rows<S, BITS, ASYM, KQ, std::min(4, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 5: qgemm_rows<S, BITS, ASYM, KQ, std::min(5, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 6: qgemm_rows<S, BITS, ASYM, KQ, std::min(6, R)>(w, group, x, m0, y, ldy, nvalid); break;
    case 7: qgemm_rows<S, BITS, ASYM, KQ, std::min(7, R)>(w, group, x, m0, y, ldy, nvalid); break;
    default: qgemm_rows<S, BITS, ASYM, KQ, std::min(8, R)>(w, group, x, m0, y, ldy, nvalid); break;
  }
}
