// Gated DeltaNet linear attention (hetero.ops.gated_delta.GatedDeltaRule): causal depthwise conv + SiLU, q/k L2
// normalisation, gating, the gated delta rule (per-token recurrence or the chunked WY/UT form) and the gated
// per-head RMSNorm, for a range of positions. The caller owns every buffer (state, history): these functions
// allocate nothing but per-thread scratch.
#pragma once

#include <cstdint>

namespace hetero {
namespace gd {

using i64 = std::int64_t;

struct Problem {
  // shapes
  i64 T;            // new positions
  i64 hk, hv, dk, dv;
  i64 kernel;       // conv taps K
  // inputs
  const float* window;   // [T + K - 1, C] pre-conv rows: K - 1 rows before the first position, then the T new ones
  const float* conv_w;   // [C, K]
  const float* conv_b;   // [C] or null
  const float* a;        // [T, hv]: g, or the raw a projection when a_log is set
  const float* b;        // [T, hv]: beta, or the raw b projection when a_log is set
  const float* a_log;    // [hv] or null
  const float* dt_bias;  // [hv] or null (with a_log)
  const float* z;        // [T, hv * dv] or null
  const float* norm_w;   // [dv] or null (with z)
  // state and output
  float* state;          // [hv, dk, dv], updated
  float* out;            // [T, hv * dv] or null (replay: the state only)
  // options
  i64 chunk;             // 0: the recurrence; else the chunked form with chunks of this size
  i64 first;             // length of the first chunk (aligns chunks to absolute positions), 1..chunk
  float scale;
  bool l2norm, conv_silu;
  float l2_eps, norm_eps;
};

// Per-ISA entry points for one value head (the driver runs heads in parallel); each head runs the conv of its own
// q / k / v channels.
struct HeadArgs {
  const Problem* p;
  const float* taps;  // [K, C] conv taps transposed (channels contiguous per tap)
  const float* g;     // [T, hv] gates (log space)
  const float* beta;  // [T, hv]
  i64 head;
  float* scratch;  // per-thread scratch of head_scratch_floats(p) floats, 64-byte aligned
};

// Scratch of one head: the chunked form's buffers (gated_delta_impl.hpp's chunk()) or the recurrence's vectors.
i64 head_scratch_floats(const Problem& p);

void head_generic(const HeadArgs& h);
void head_avx2(const HeadArgs& h);
void head_avx512(const HeadArgs& h);

// The whole problem: gating, then the heads in parallel (conv, rule, norm). isa: "avx512", "avx2" or anything else (generic).
void run(const Problem& p, const char* isa, int threads);

}  // namespace gd
}  // namespace hetero
