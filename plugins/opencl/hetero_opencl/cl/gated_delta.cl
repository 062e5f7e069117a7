// GatedDeltaRule (hetero.ops.gated_delta): the short causal conv over the node's input history, q/k L2
// normalisation, the gated delta-rule recurrence over a device-resident state, and the gated per-head RMSNorm.
//
// History layout (device buffers owned by the node): hx [K - 1 + capacity, C] holds the pre-conv rows with K - 1
// leading zero rows, so the conv window of position p is rows p .. p + K - 1; ha / hb [capacity, Hv] hold the raw
// decay / beta rows. The state is [Hv, DK, Dv]. GDN_DK (the key head size) is a build define: each work-item of
// the recurrence keeps one state column (DK floats) in private memory for the whole token range.

#ifndef GDN_DK
#define GDN_DK 128
#endif

// y[t, c] = act(sum_j w[c, j] hx[start + t + j, c] + bias[c]) for t in [0, T), one work-item per (c, t).
__kernel void gdn_conv(__global const float* hx, __global const float* w, __global const float* bias,
                       __global float* y, int C, int K, int start, int has_bias, int silu) {
  const int c = get_global_id(0), t = get_global_id(1);
  if (c >= C) return;
  __global const float* xp = hx + (long)(start + t) * C + c;
  __global const float* wp = w + (long)c * K;
  float acc = has_bias ? bias[c] : 0.0f;
  for (int j = 0; j < K; ++j) acc += wp[j] * xp[(long)j * C];
  if (silu) acc = acc * sigmoidf(acc);
  y[(long)t * C + c] = acc;
}

// In place on the conv output [T, C]: each of the 2 * Hk q and k heads of row t scaled to unit length
// (x / sqrt(sum x^2 + eps)) when l2 is set; q heads then multiplied by `scale`. One work-item per (head, t).
__kernel void gdn_qk(__global float* y, int C, int Hk, int l2, float eps, float scale) {
  const int head = get_global_id(0), t = get_global_id(1);
  if (head >= 2 * Hk) return;
  __global float* p = y + (long)t * C + (long)head * GDN_DK;
  float f = 1.0f;
  if (l2) {
    float s = 0.0f;
    for (int i = 0; i < GDN_DK; ++i) s += p[i] * p[i];
    f = 1.0f / sqrt(s + eps);
  }
  if (head < Hk) f *= scale;
  for (int i = 0; i < GDN_DK; ++i) p[i] *= f;
}

// The recurrence over rows [t0, t1) of the prepared conv output y [T, C] (q | k | v), for value head h and value
// column v (one work-item each):
//   S *= exp(g_t);  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t
// with g = -exp(a_log) softplus(a + dt_bias) and beta = sigmoid(b) when gating is set, else g = a, beta = b
// (a / b rows are ha / hb rows ab0 + t). o_t goes to out[t, h, v] when has_out is set.
__kernel void gdn_recurrent(__global const float* y, __global const float* ha, __global const float* hb,
                            __global const float* a_log, __global const float* dt_bias, __global float* state,
                            __global float* out, int C, int Hk, int Hv, int Dv, int ab0, int t0, int t1, int gating,
                            int has_out) {
  const int v = get_global_id(0), h = get_global_id(1);
  if (v >= Dv || h >= Hv) return;
  const int kh = h / (Hv / Hk);
  __global float* sp = state + (long)h * GDN_DK * Dv + v;
  float s[GDN_DK];
  for (int i = 0; i < GDN_DK; ++i) s[i] = sp[(long)i * Dv];
  const float neg_a = gating ? -exp(a_log[h]) : 0.0f;
  const float dtb = gating ? dt_bias[h] : 0.0f;
  for (int t = t0; t < t1; ++t) {
    __global const float* row = y + (long)t * C;
    __global const float* q = row + kh * GDN_DK;
    __global const float* k = row + (Hk + kh) * GDN_DK;
    const float x = row[2 * Hk * GDN_DK + h * Dv + v];
    const float ra = ha[(long)(ab0 + t) * Hv + h], rb = hb[(long)(ab0 + t) * Hv + h];
    const float g = gating ? neg_a * softplusf(ra + dtb) : ra;
    const float beta = gating ? sigmoidf(rb) : rb;
    const float decay = exp(g);
    float rec = 0.0f;
    for (int i = 0; i < GDN_DK; ++i) {
      s[i] *= decay;
      rec += s[i] * k[i];
    }
    const float u = beta * (x - rec);
    float o = 0.0f;
    for (int i = 0; i < GDN_DK; ++i) {
      s[i] += k[i] * u;
      o += s[i] * q[i];
    }
    if (has_out) out[((long)t * Hv + h) * Dv + v] = o;
  }
  for (int i = 0; i < GDN_DK; ++i) sp[(long)i * Dv] = s[i];
}

// In place on o [T, Hv, Dv]: rmsnorm(o_h) * w * silu(z_h) per value head; one work-item per (h, t).
__kernel void gdn_gated_norm(__global float* o, __global const float* z, __global const float* w, int Hv, int Dv,
                             float eps) {
  const int h = get_global_id(0), t = get_global_id(1);
  if (h >= Hv) return;
  const long base = ((long)t * Hv + h) * Dv;
  float s = 0.0f;
  for (int i = 0; i < Dv; ++i) s += o[base + i] * o[base + i];
  const float inv = 1.0f / sqrt(s / (float)Dv + eps);
  for (int i = 0; i < Dv; ++i) {
    const float zi = z[base + i];
    o[base + i] = o[base + i] * inv * w[i] * (zi * sigmoidf(zi));
  }
}
