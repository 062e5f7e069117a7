// AVX-512 VNNI + VBMI + GFNI traits of the LLM kernels (Ice Lake, Zen 4 and later): the VNNI ones plus the 6-bit
// unpack of q6_k's one-row (decode) tile with gf2p8affineqb. Only included by llm_kernels_avx512vbmi.cpp
// (-mavx512vbmi -mgfni on top of the VNNI flags), entered only when the CPU reports all three.
#pragma once
#include "llm_simd_avx512vnni.hpp"

namespace {
struct LlmSimdVbmi : LlmSimdVnni {
  // q6_k's 6-bit values of one 64-byte step from the record's planes (llm.hpp: nibble vector v, high-bit vector hv
  // shared by steps 2v' and 2v'+1, u = t % 2), the same bytes as unpack_step's. Each gf2p8affineqb moves
  // chosen bits of every byte to chosen places and clears the others (a bit matrix per byte), so a 2-bit field or a
  // nibble comes out clean and one vpternlogd (a bitwise select under a constant mask) merges the two: 9 operations
  // a step pair instead of 13 shifts, masks and ORs. On Zen 4 gf2p8affineqb shares its pipes with vpdpbusd while the
  // shifts do not, so hi1's field stays a shift (one-row tile in L2: 0.90x the VNNI tile's time; all nine as
  // gf2p8affineqb 0.92x, the high nibbles by shifts 0.95-0.96x; docs/llm-benchmarks.md, branch q6k23).
  static constexpr bool SIX_BIT_GF = true;
  static void six_bit_step(B v, B hv, int u, B& lo, B& hi) {
    const B lo_mask = _mm512_set1_epi8(0x0f), hi_field = _mm512_set1_epi8(0x30);
    lo = select(lo_mask, v, move_bits(hv, u ? kBits23To45 : kBits01To45));  // hv's bits 2u, 2u+1 to 4-5
    const B nib_hi = move_bits(v, kBits47To03);  // the high nibble, alone in bits 0-3
    // hv's bits 4+2u, 5+2u to 4-5 (u = 1: a 16-bit shift; what it moves into bits 6-7 the select drops, and
    // nib_hi is zero there)
    hi = select(hi_field, u ? _mm512_srli_epi16(hv, 2) : hv, nib_hi);
  }

  // The 5-bit values of one 64-byte step t of a q5_0 / q5_1 / q5_k record (llm.hpp: byte (i, c) of vector v the low
  // element's 5 bits and the high element's bits 2-4 in bits 5-7, of hv the high element's bits 0-1 in bits 2t,
  // 2t+1), for the one-row tile. lo is one mask. hi comes out as 8 x the value, in place: v's bits 5-7 are its bits
  // 2-4 times 8, and gf2p8affineqb moves hv's two bits to bits 3-4 and clears the rest of the byte, so one vpternlogd
  // (select) merges them (<= 248, an unsigned byte of vpdpbusd; the chain's sum is shifted right by 3, exact). 3
  // operations a step (one on the dots' pipes) where the former layout's shifts and masks took 7.
  static constexpr bool FIVE_BIT_GF = true;
  static void five_bit_step(B v, B hv, int t, B& lo, B& hi) {
    lo = _mm512_and_si512(v, _mm512_set1_epi8(0x1f));
    const unsigned long long m = (1ull << 8 * (7 - 3)) << (2 * t) | (1ull << 8 * (7 - 4)) << (2 * t + 1);
    hi = select(_mm512_set1_epi8(static_cast<char>(0xe0)), v, move_bits(hv, m));
  }

 private:
  // gf2p8affineqb matrices (byte 7 - k: the input bits that make output bit k).
  static constexpr unsigned long long kBits01To45 = (1ull << 8 * (7 - 4)) << 0 | (1ull << 8 * (7 - 5)) << 1;
  static constexpr unsigned long long kBits23To45 = (1ull << 8 * (7 - 4)) << 2 | (1ull << 8 * (7 - 5)) << 3;
  static constexpr unsigned long long kBits47To03 = (1ull << 8 * 7) << 4 | (1ull << 8 * 6) << 5 |
                                                    (1ull << 8 * 5) << 6 | (1ull << 8 * 4) << 7;
  static B move_bits(B v, unsigned long long matrix) {
    return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(static_cast<long long>(matrix)), 0);
  }
  // mask ? a : b, bit by bit (vpternlogd 0xe4: a where the mask is set, else b).
  static B select(B mask, B a, B b) { return _mm512_ternarylogic_epi32(a, b, mask, 0xe4); }
};
}  // namespace
