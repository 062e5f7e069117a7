// LLM kernels of the CPU plugin (the hetero-domain ops of hetero.ops.llm): block-quantized and float GEMV/GEMM,
// attention over a KV cache owned by the kernel, and the small row ops. Shared declarations.
//
// The kernels are written once (llm_impl.hpp) over per-ISA traits (llm_simd_<isa>.hpp); the per-ISA files
// (llm_kernels_generic/avx2/avx512/avx512vnni/avx512vbmi.cpp) each instantiate them into one `LlmKernels` table;
// the drivers (llm.cpp) run without special flags and call through the table chosen from the plugin's active ISA
// (hetero::active(), so `_native.set_isa` switches these kernels too), plus VNNI (and VBMI + GFNI) when the CPU has it.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "common.hpp"

namespace hetero {
namespace llm {

// ---- quantized weights, repacked ("RB16": 16 output rows interleaved) ----
//
// Sources: hetero's block formats (hetero.contract.quant: per row, ceil(K/B) blocks of [f16 d][f16 m]? + quants) and
// GGUF's q5_0 / q5_1 / q4_k / q5_k / q6_k blocks (llm_ggml.cpp). Repacked, rows are grouped by 16 (the last group
// zero-padded: zero scales) and each (group, block) is one record:
//   header | quants
// header, kq == 0: d[16] (f16, one per row) | m[16] (f16, asymmetric formats only)
//         kq == 1 (q4_k, q5_k): sc[16] | mn[16]     (u8: 6-bit scale and min of this block of 32, per row)
//         kq == 2 (q6_k):       sc_lo[16] | sc_hi[16] (i8: the scales of the block's first and second 16 elements)
// k-quant records are grouped by super-block (sub = 8 blocks of 32 = 256 elements), each group of 8 records
// preceded by the super-block's per-row f16 d[16] (| dmin[16] for kq == 1). GGUF q5_0 / q5_1 records are walked in
// runs of sub = 8 too, with no header between them (sb_hdr 0: the same bytes as one run of records; the last run of a
// group may be shorter): their tiles streamed from memory at 82-84% of the read probe walking the records one by one,
// 86-91% in runs of 8 (docs/llm-benchmarks.md, branch dsm15).
// quants, 8-bit: B/4 vectors of 64 bytes; vector t, lane i (4 bytes) = row i's elements 4t..4t+3 as unsigned bytes
//     (symmetric: the int8 value + 128, i.e. xor 0x80; asymmetric: q as stored).
// quants, 4/5/6-bit: B/8 vectors of 64 bytes ("nibble plane"); vector t, lane i, byte c: low nibble = row i's element
//     4t+c, high nibble = element B/2 + 4t + c (bits 0-3 of the values as stored). 6-bit formats then add two
//     64-byte vectors, vector v byte (i, c) holding bits 4-5 of element 4t+c in bits 2u..2u+1 and of element
//     B/2+4t+c in bits 4+2u..5+2u, t = 2v + u.
//   5-bit formats (q5_0, q5_1, q5_k) split the values differently, the same bytes a record: vector t byte (i, c) =
//     element 4t+c's 5 bits in bits 0-4 and bits 2-4 of element B/2+4t+c in bits 5-7, then one 64-byte vector whose
//     byte (i, c) holds bits 0-1 of element B/2+4t+c in bits 2t, 2t+1 (t < 4). The low value is one mask; with GFNI
//     the high one is 8 x its value in place (bits 5-7 kept, two bits merged below them: llm_simd_avx512vbmi.hpp),
//     where the former nibble plane + bit-4 vector took 7 shifts and masks a step (one-row q5_0 tile in L1: 0.67x
//     the time; docs/llm-benchmarks.md, branch q5_29).
// So a 4-byte broadcast of the int8 activation against one vector gives 16 rows' partial dot products at once.
// Weight values: kq 0 symmetric d * (q - offset), asymmetric d * q + m; kq 1 d*sc * q - dmin*mn; kq 2
// d*sc * (q - 32).
constexpr int QR = 16;  // rows per group
constexpr int KT = 64;  // attention: positions per K-cache tile

struct QPack {
  int bits = 4, bs = 32;        // value bits (4/8 hetero; 5 q5_0/q5_1/q5_k; 4 q4_k; 6 q6_k), elements per block
  bool asym = false;
  int kq = 0;                   // scale layout (see above)
  int sub = 1;                  // blocks per super-block (k-quants: 8)
  int ggml = 0;                 // source: 0 = hetero q4/q8, else a GgmlType (llm_ggml.cpp)
  i64 n = 0, k = 0, nb = 0;     // rows, logical row length, blocks per row
  i64 groups = 0;               // ceil(n / 16)
  i64 rec_bytes = 0;            // bytes per (group, block) record
  i64 sb_hdr = 0;               // bytes of a super-block's header (k-quants: 32 or 64; else 0)
  i64 super_bytes = 0;          // sb_hdr + sub * rec_bytes
  i64 group_bytes = 0;          // ceil(nb / sub) * sb_hdr + nb * rec_bytes (the last super-block may be short)
  i64 header_bytes() const { return kq ? 32 : (asym ? 64 : 32); }
  i64 nibble_bytes() const { return QR * bs / 2; }  // the nibble plane (4/5/6-bit formats)
  bool nibbles() const { return bits < 8; }         // activations in pair4 order
  // The integer offset folded into the weights: the true dot is isum - offset * sum(xq) (q4 sym: 8; q5_0: 16;
  // q6_k: 32 per half block; q8 sym: 128).
  int offset() const { return asym ? 0 : (bits == 8 ? 128 : 1 << (bits - 1)); }
  // Record of block b (b in [0, nb)) within a group.
  const std::uint8_t* record(const std::uint8_t* group, i64 b) const {
    return group + (b / sub) * super_bytes + sb_hdr + (b % sub) * rec_bytes;
  }
  // Fill the layout sizes from bits / bs / asym / kq / sub / n / k.
  void layout() {
    nb = (k + bs - 1) / bs;
    groups = (n + QR - 1) / QR;
    const i64 quants = bits == 8 ? QR * bs : nibble_bytes() + (bits == 5 ? QR * bs / 8 : bits == 6 ? QR * bs / 4 : 0);
    rec_bytes = header_bytes() + quants;
    sb_hdr = kq == 1 ? 64 : (kq == 2 ? 32 : 0);
    super_bytes = sb_hdr + sub * rec_bytes;
    group_bytes = ((nb + sub - 1) / sub) * sb_hdr + nb * rec_bytes;
  }
};

// Activation rows quantized to int8 per block of B (same B as the weights), zero-padded to nb*B.
struct XQ {
  const std::int8_t* q;   // [M][nb*B]
  const float* d;         // [M][nb]   scale
  const std::int32_t* s;  // [M][nb]   sum of the int8 values
  const float* ds;        // [M][nb]   d * s
  const std::int32_t* sl; // [M][nb]   sum of the int8 values of the block's first half (q6_k's per-16 scales)
  i64 ldq, nb;            // ldq = nb*B bytes
  i64 rows = 0;           // M, the call's rows: where its tiles prefetch the weights (llm_impl.hpp, prefetch_distance)
};

// GGUF block formats (llm_ggml.cpp): the QPack of a GGUF wtype ("q5_0", "q5_1", "q4_k", "q5_k", "q6_k"), false
// for other names; the bytes of one source row; repacking groups [g0, g1) of one matrix; one row to float.
bool ggml_pack(const std::string& wtype, QPack& pk);
i64 ggml_row_bytes(const QPack& pk);
void ggml_repack(const QPack& pk, const std::uint8_t* src, std::uint8_t* dst, i64 g0, i64 g1);
void ggml_dequant_row(const QPack& pk, const std::uint8_t* row, float* out);

// Float weight element types of QMatMul / MoE / Embedding.
enum WType : int { W_F32 = 0, W_F16 = 1, W_BF16 = 2 };

// Lines a decode step's attention kernels prefetch into L2 while they compute one kv head: the next head's K tiles
// and V rows, two lines a pass of their inner loops (qk_tile's rows of a K tile, pv_tile's value rows), so that a
// task running its heads one after another finds each head's lines on the way (AttentionRun, llm.cpp). The ranges:
// [cur, end), then `runs` more of `len` bytes `stride` apart after `base` (the last one `last` bytes).
struct KvAhead {
  const char* cur = nullptr;
  const char* end = nullptr;
  const char* base = nullptr;
  std::size_t stride = 0, len = 0, last = 0;
  i64 runs = 0;
};

struct LlmKernels {
  const char* name;
  int max_mr;  // x rows per qgemm tile call (1..max_mr)
  // The k-quant tiles (kq != 0) take activations with one scale per super-block (x_scale_block): VNNI, whose
  // tiles then sum a super-block's scaled int32 dots in integer and convert once (llm_impl.hpp, BlockScales::add_int).
  bool k_super;
  // Quantize rows x[m*ldx + 0:k] (m in [0, M)) into XQ buffers (q: [M][nb*bs], d/s/ds/sl: [M][nb]), one scale per
  // sbs elements (a multiple of bs: each block's d / ds hold its scale block's scale; the sums stay per block).
  // pair4 (for 4/5/6-bit weights): within each block, 4-byte word t of the low half and word t of the high half are
  // stored side by side (words 2t, 2t+1), the order in which the kernels broadcast them.
  void (*quantize_x)(const float* x, i64 M, i64 ldx, i64 k, int bs, int sbs, bool pair4, std::int8_t* q, float* d,
                     std::int32_t* s, float* ds, std::int32_t* sl);
  // y[m*ldy + g*16 + j] (j < nvalid) = dot(x row m0+m, weight row g*16+j), m < mr, one 16-row group. `group`
  // points at the group's first record. Overwrites y.
  void (*qgemm_group)(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
                      int nvalid);
  // Float weights [N, K] (row stride ldw elements, element type wt): y[m*ldy + j] = dot(x[m], w[j]) for
  // j in [0, nrows) (nrows <= 4) and m < mr (mr <= 4).
  void (*fgemm_tile)(int wt, const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y,
                     i64 ldy);
  // n float16 -> float32.
  void (*f16_to_f32)(const std::uint16_t* src, float* dst, i64 n);
  void (*f32_to_f16)(const float* src, std::uint16_t* dst, i64 n);
  // Attention. The K cache is stored in tiles of KT=64 positions, transposed: tile[d][64] of the element type
  // `kind` (KvType); a KV_Q8 tile is int8 [d][64] followed by its float scales [ceil(d/32)][64] (scale of block b
  // of position l's row at [b][l]). The V cache is row by row: v[l][d] (KV_Q8: int8 rows, scales vscale[l][nb]).
  // q rows are f32 (row stride ldq).
  // s[r*lds + l] = scale * sum_i q[r][i] * k(i, l), r < nr (<= 4), l < 64, k(i, l) the value the cache holds (for
  // q8: int8 * its block scale). All 64 lanes are written; the positions past the filled cache hold finite stale
  // values that the caller masks. ahead (or nullptr): lines to prefetch on the way (KvAhead).
  void (*qk_tile)(const float* q, i64 ldq, int nr, const void* ktile, int kind, i64 d, float scale, float* s,
                  i64 lds, KvAhead* ahead);
  // o[r*d + :] = o[r*d + :] * corr[r] + sum_l p[r*ldp + l] * v(l, :), r < nr (<= 4), l < nk; vscale (KV_Q8
  // only, else unused): [nk][ceil(d/32)] block scales of the nk rows. ahead: as qk_tile's.
  void (*pv_tile)(const float* p, i64 ldp, int nr, const void* v, int kind, const float* vscale, i64 nk, i64 d,
                  const float* corr, float* o, KvAhead* ahead);
  // numpy's argmax of y[0, n) (n >= 1): the index of the first NaN if any, else of the first maximum; *best gets
  // its value. The fused LM head (llm_matmul_argmax) runs it on each task's columns while they are in L1.
  i64 (*argmax)(const float* y, i64 n, float* best);
};

// Elements per activation scale for weights pk on kernels kr: a k-quant super-block where kr.k_super, else a block.
inline int x_scale_block(const LlmKernels& kr, const QPack& pk) {
  return kr.k_super && pk.kq ? pk.bs * pk.sub : pk.bs;
}

const LlmKernels* llm_kernels_generic();
const LlmKernels* llm_kernels_avx2();        // nullptr unless x86-64
const LlmKernels* llm_kernels_avx512();      // nullptr unless x86-64
const LlmKernels* llm_kernels_avx512vnni();  // nullptr unless x86-64
const LlmKernels* llm_kernels_avx512vbmi();  // nullptr unless x86-64: VNNI + VBMI + GFNI

// ---- attention: KV cache element types (the Attention op's kv_dtype), see LlmKernels::qk_tile
// KV_Q4R / KV_Q3R: the rotated low-bit formats of kv_quant.hpp, decoded into a float tile before qk_tile / pv_tile
// (which then see KV_F32).
enum KvType : int { KV_F32 = 0, KV_F16 = 1, KV_Q8 = 2, KV_Q4R = 3, KV_Q3R = 4 };
constexpr int KVB = 32;  // q8 cache: values of a (position, head) row per float scale

// ---- portable scalar helpers ----
// The pair4 order of one block of bs int8 values (see LlmKernels::quantize_x).
inline void pair_words(std::int8_t* qb, int bs) {
  std::int32_t w[32], out[32];
  std::memcpy(w, qb, static_cast<std::size_t>(bs));
  const int h = bs / 8;
  for (int t = 0; t < h; ++t) {
    out[2 * t] = w[t];
    out[2 * t + 1] = w[h + t];
  }
  std::memcpy(qb, out, static_cast<std::size_t>(bs));
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline std::uint16_t float_to_half(float f) {  // round to nearest even
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (ax < 0x38800000u) {                                                     // subnormal or zero
    if (ax < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = ax + 0xfffu + ((ax >> 13) & 1);  // round the 13 dropped bits to nearest even
  return static_cast<std::uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace llm
}  // namespace hetero
