// ONNX opset-27 LinearAttention and CausalConvWithState (hetero.ops.linear_attention), float32.
//
// LinearAttention: one work-item per (batch, KV head, value column v) keeps column v of that head's state S
// (LA_DK floats, a build define) in private memory for the whole sequence, updates it token by token with the
// node's rule, and writes o_t for each query head of the group (GQA: query head h reads KV head h / group).

#ifndef LA_DK
#define LA_DK 64
#endif

// Rule codes: keep in sync with hetero_opencl.kernels.linear_attention.RULES.
#define LA_LINEAR 0
#define LA_GATED 1
#define LA_DELTA 2
#define LA_GATED_DELTA 3

// q [B, T, Hq * DK], k [B, T, Hkv * DK], v [B, T, Hkv * Dv]; decay [B, T, Hkv] or [B, T, Hkv * DK]
// (per_key_decay); beta [B, T, beta_heads] (Hkv or 1); state [B, Hkv, DK, Dv] in (has_past) and out.
__kernel void linear_attention(__global const float* q, __global const float* k, __global const float* v,
                               __global const float* past, __global const float* decay,
                               __global const float* beta, __global float* out, __global float* state, int T,
                               int Hq, int Hkv, int Dv, int rule, int has_past, int per_key_decay, int beta_heads,
                               float scale) {
  const int col = get_global_id(0), h = get_global_id(1), b = get_global_id(2);
  if (col >= Dv || h >= Hkv) return;
  const int group = Hq / Hkv;
  const long state_off = (((long)b * Hkv + h) * LA_DK) * Dv + col;
  float s[LA_DK];
  for (int i = 0; i < LA_DK; ++i) s[i] = has_past ? past[state_off + (long)i * Dv] : 0.0f;
  const bool gated = rule == LA_GATED || rule == LA_GATED_DELTA;
  const bool delta = rule == LA_DELTA || rule == LA_GATED_DELTA;
  for (int t = 0; t < T; ++t) {
    const long bt = (long)b * T + t;
    __global const float* kt = k + (bt * Hkv + h) * LA_DK;
    const float x = v[(bt * Hkv + h) * Dv + col];
    if (gated) {
      if (per_key_decay) {
        __global const float* g = decay + (bt * Hkv + h) * LA_DK;
        for (int i = 0; i < LA_DK; ++i) s[i] *= exp(g[i]);
      } else {
        const float f = exp(decay[bt * Hkv + h]);
        for (int i = 0; i < LA_DK; ++i) s[i] *= f;
      }
    }
    float u = x;
    if (delta) {
      float rec = 0.0f;
      for (int i = 0; i < LA_DK; ++i) rec += s[i] * kt[i];
      u = beta[bt * beta_heads + (beta_heads == 1 ? 0 : h)] * (x - rec);
    }
    for (int i = 0; i < LA_DK; ++i) s[i] += kt[i] * u;
    for (int j = 0; j < group; ++j) {
      const int hq = h * group + j;
      __global const float* qt = q + (bt * Hq + hq) * LA_DK;
      float o = 0.0f;
      for (int i = 0; i < LA_DK; ++i) o += s[i] * qt[i];
      out[(bt * Hq + hq) * Dv + col] = scale * o;
    }
  }
  for (int i = 0; i < LA_DK; ++i) state[state_off + (long)i * Dv] = s[i];
}

// CausalConvWithState over x [B, C, L] with taps w [C, 1, K]: p = concat(past [B, C, K - 1] or zeros, x) along
// the length; y[b, c, t] = act(bias[c] + sum_j w[c, j] p[b, c, t + j]); one work-item per (t, c, b).
inline float cc_at(__global const float* x, __global const float* past, int has_past, long bc, int L, int K, int i) {
  if (i >= K - 1) return x[bc * L + i - (K - 1)];
  return has_past ? past[bc * (K - 1) + i] : 0.0f;
}

__kernel void causal_conv(__global const float* x, __global const float* w, __global const float* bias,
                          __global const float* past, __global float* y, int C, int L, int K, int has_bias,
                          int has_past, int silu) {
  const int t = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
  if (t >= L || c >= C) return;
  const long bc = (long)b * C + c;
  float acc = has_bias ? bias[c] : 0.0f;
  for (int j = 0; j < K; ++j) acc += w[(long)c * K + j] * cc_at(x, past, has_past, bc, L, K, t + j);
  if (silu) acc = acc * sigmoidf(acc);
  y[bc * L + t] = acc;
}

// present[b, c, j] = p[b, c, L + j] for j < K - 1: the last K - 1 values of the padded sequence.
__kernel void causal_conv_state(__global const float* x, __global const float* past, __global float* present, int C,
                                int L, int K, int has_past) {
  const int j = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
  if (j >= K - 1 || c >= C) return;
  const long bc = (long)b * C + c;
  present[bc * (K - 1) + j] = cc_at(x, past, has_past, bc, L, K, L + j);
}
