// LLM decoder kernels that do not read weights in a block format: RMSNorm, rotary embedding, the KV cache store,
// attention over the device-resident cache, MoE routing and the MoE combine.

// y = x / sqrt(mean(x^2) + eps) * (offset + w), one work-group per row of length D.
__kernel void rmsnorm(__global const float* x, __global const float* w, __global float* y, int D, float eps,
                      float offset, __local float* scratch) {
  const int lid = get_local_id(0), size = get_local_size(0), row = get_group_id(0);
  __global const float* xp = x + (long)row * D;
  __global float* yp = y + (long)row * D;
  float s = 0.0f;
  for (int i = lid; i < D; i += size) s += xp[i] * xp[i];
  const float inv = rsqrt(group_sum(s, scratch, lid, size) / (float)D + eps);
  for (int i = lid; i < D; i += size) yp[i] = (xp[i] * inv) * (offset + w[i]);
}

// NeoX rotary embedding on [T, H, D]; table holds cos then sin for each position: table[(pos * 2 + 0/1) * rot / 2 + i]
// (already multiplied by the attention factor, computed on the host in float64 like the reference).
// past_len is read on the device (so a recorded launch stays valid from step to step); positions past the table's
// `cap` rows are clamped (the host checks them where it can; the table holds the session's context).
__kernel void rope(__global const float* x, __global float* y, __global const float* table, int H, int D, int rot,
                   __global const long* past_len, int cap) {
  const int i = get_global_id(0), h = get_global_id(1), t = get_global_id(2);
  if (i >= D || h >= H) return;
  const long base = ((long)t * H + h) * D;
  const int hr = rot / 2;
  const long pos = clamp(past_len[0] + t, 0L, (long)cap - 1);
  float v = x[base + i];
  if (i < hr) {
    const float c = table[(pos * 2) * hr + i], s = table[(pos * 2 + 1) * hr + i];
    v = v * c - x[base + i + hr] * s;
  } else if (i < rot) {
    const float c = table[(pos * 2) * hr + i - hr], s = table[(pos * 2 + 1) * hr + i - hr];
    v = v * c + x[base + i - hr] * s;
  }
  y[base + i] = v;
}

// The KV cache element: float16 storage with -DKV_HALF (the Attention op's kv_dtype "f16": through vload_half /
// vstore_half, core OpenCL 1.2, or native half loads and stores where the device has cl_khr_fp16 (HAS_FP16);
// stores round to nearest even either way), else float32.
#ifdef KV_HALF
#define KV_T half
#define KV_LOAD(p, i) HALF_LOAD((i), (p))
#define KV_LOAD4(p, i) HALF_LOAD4(0, (p) + (i))
#define KV_STORE(p, i, x) HALF_STORE((x), (i), (p))
#else
#define KV_T float
#define KV_LOAD(p, i) ((p)[i])
#define KV_LOAD4(p, i) vload4(0, (p) + (i))
#define KV_STORE(p, i, x) ((p)[i] = (x))
#endif

// cache[h, past_len + t, d] = new[t, h, d] for the K and V caches ([Hkv, max_ctx, D] each); rows outside the cache
// are not written.
__kernel void kv_store(__global const float* k, __global const float* v, __global KV_T* kc, __global KV_T* vc,
                       int Hkv, int D, int max_ctx, __global const long* past_len) {
  const int d = get_global_id(0), h = get_global_id(1), t = get_global_id(2);
  const long row = past_len[0] + t;
  if (d >= D || h >= Hkv || row < 0 || row >= max_ctx) return;
  const long src = ((long)t * Hkv + h) * D + d;
  const long dst = ((long)h * max_ctx + row) * D + d;
  KV_STORE(kc, dst, k[src]);
  KV_STORE(vc, dst, v[src]);
}

#ifndef ATT_WG
#define ATT_WG 64
#endif
#define ATT_MAX_DPT 8

// Causal attention of query row t, head h over cache positions [0, past_len + t], one work-group per (h, t).
// Keys are walked in tiles of ATT_WG (one score per work-item), with a running max and sum (online softmax), so
// no score buffer is needed; each work-item owns output dims lid, lid + ATT_WG, ... (head_dim <= 8 * ATT_WG).
__kernel __attribute__((reqd_work_group_size(ATT_WG, 1, 1)))
void attention(__global const float* q, __global const KV_T* kc, __global const KV_T* vc, __global float* out,
               int Hq, int Hkv, int D, int max_ctx, int past_len, float scale) {
  const int lid = get_local_id(0), h = get_group_id(1), t = get_group_id(2);
  const int kvh = h / (Hq / Hkv);
  // past_len stays a scalar argument, so the bound of the tile loop below (which holds barriers) is a uniform
  // kernel argument; a bound replay launch passes it from past_len's host copy at each call.
  const int L = clamp(past_len + t + 1, 1, max_ctx);
  __local float qs[ATT_WG * ATT_MAX_DPT];
  __local float p[ATT_WG];
  __local float red[ATT_WG];
  __global const float* qp = q + ((long)t * Hq + h) * D;
  for (int d = lid; d < D; d += ATT_WG) qs[d] = qp[d];
  barrier(CLK_LOCAL_MEM_FENCE);
  __global const KV_T* kb = kc + (long)kvh * max_ctx * D;
  __global const KV_T* vb = vc + (long)kvh * max_ctx * D;
  float m = -INFINITY, l = 0.0f;
  float acc[ATT_MAX_DPT];
  for (int i = 0; i < ATT_MAX_DPT; ++i) acc[i] = 0.0f;
  for (int j0 = 0; j0 < L; j0 += ATT_WG) {
    const int j = j0 + lid;
    float s = -INFINITY;
    if (j < L) {
      __global const KV_T* kp = kb + (long)j * D;
      float4 a4 = 0.0f;
      int d = 0;
      if ((D & 3) == 0) {
        for (; d < D; d += 4) a4 += vload4(0, qs + d) * KV_LOAD4(kp, d);
      }
      float a = a4.x + a4.y + a4.z + a4.w;
      for (; d < D; ++d) a += qs[d] * KV_LOAD(kp, d);
      s = a * scale;
    }
    const float mt = group_max(s, red, lid, ATT_WG);
    const float mnew = fmax(m, mt);
    const float pj = j < L ? exp(s - mnew) : 0.0f;
    p[lid] = pj;
    const float st = group_sum(pj, red, lid, ATT_WG);  // its barriers also publish p[]
    const float corr = exp(m - mnew);
    l = l * corr + st;
    const int cnt = min(ATT_WG, L - j0);
    for (int i = 0; i < ATT_MAX_DPT; ++i) {
      const int d = lid + i * ATT_WG;
      if (d < D) {
        float a = acc[i] * corr;
        for (int jj = 0; jj < cnt; ++jj) a += p[jj] * KV_LOAD(vb, (long)(j0 + jj) * D + d);
        acc[i] = a;
      }
    }
    m = mnew;
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / l;
  __global float* op = out + ((long)t * Hq + h) * D;
  for (int i = 0; i < ATT_MAX_DPT; ++i) {
    const int d = lid + i * ATT_WG;
    if (d < D) op[d] = acc[i] * inv;
  }
}

// MoE routing for token t: softmax over E router logits, top_k by descending probability (ties: lower expert),
// weights optionally renormalised. chosen/weights are [T, top_k].
__kernel void moe_route(__global const float* logits, __global int* chosen, __global float* weights, int T, int E,
                        int top_k, int normalize) {
  const int t = get_global_id(0);
  if (t >= T) return;
  __global const float* lp = logits + (long)t * E;
  float m = -INFINITY;
  for (int e = 0; e < E; ++e) m = fmax(m, lp[e]);
  float s = 0.0f;
  for (int e = 0; e < E; ++e) s += exp(lp[e] - m);
  float total = 0.0f;
  int prev = -1;
  float prev_v = INFINITY;
  for (int k = 0; k < top_k; ++k) {
    int best = -1;
    float bv = -INFINITY;
    for (int e = 0; e < E; ++e) {
      const float v = lp[e];
      // strictly after the previous pick in (value desc, index asc) order
      const bool after = v < prev_v || (v == prev_v && e > prev);
      if (after && (best < 0 || v > bv)) {
        best = e;
        bv = v;
      }
    }
    const float pv = exp(bv - m) / s;
    chosen[t * top_k + k] = best;
    weights[t * top_k + k] = pv;
    total += pv;
    prev = best;
    prev_v = bv;
  }
  if (normalize) {
    for (int k = 0; k < top_k; ++k) weights[t * top_k + k] /= total;
  }
}

// out[t, j] = sum_k weights[t, k] * part[t * top_k + k, j]
__kernel void moe_combine(__global const float* part, __global const float* weights, __global float* out, int H,
                          int top_k) {
  const int j = get_global_id(0), t = get_global_id(1);
  if (j >= H) return;
  float acc = 0.0f;
  for (int k = 0; k < top_k; ++k) acc += weights[t * top_k + k] * part[((long)t * top_k + k) * H + j];
  out[(long)t * H + j] = acc;
}
