// LSTM (ONNX gates i, o, f, c; default activations sigmoid / tanh / tanh; no peepholes, clip or sequence_lens).
// The input projections of every step, gx[d][t * B + b][4H] = x_t W_d^T, come from the tiled GEMM beforehand; this
// kernel runs the recurrence: one work-group per (batch entry, direction) walks the sequence, its work-items
// sharing the hidden units (h of the previous step in local memory, c in the Y_c output itself).

__kernel void lstm_recurrence(__global const float* gx, __global const float* R, __global const float* bias,
                              __global const float* h0, __global const float* c0, __global float* Y,
                              __global float* Yh, __global float* Yc, int T, int B, int H, int D, int has_bias,
                              int has_h0, int has_c0, int reverse_mask, __local float* hs) {
  const int lid = get_local_id(0), size = get_local_size(0);
  const int b = get_group_id(0), d = get_group_id(1);
  const bool reverse = (reverse_mask >> d) & 1;
  __local float* h = hs;       // h_{t-1}
  __local float* hn = hs + H;  // h_t, published after the step
  __global const float* Rd = R + (long)d * 4 * H * H;
  __global const float* bd = bias + (long)d * 8 * H;
  __global float* c = Yc + ((long)d * B + b) * H;
  for (int j = lid; j < H; j += size) {
    h[j] = has_h0 ? h0[((long)d * B + b) * H + j] : 0.0f;
    c[j] = has_c0 ? c0[((long)d * B + b) * H + j] : 0.0f;
  }
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  for (int step = 0; step < T; ++step) {
    const int t = reverse ? T - 1 - step : step;
    __global const float* g = gx + ((long)d * T * B + (long)t * B + b) * 4 * H;
    for (int j = lid; j < H; j += size) {
      float acc[4];
      for (int q = 0; q < 4; ++q) {
        const int row = q * H + j;
        float s = g[row] + (has_bias ? bd[row] + bd[4 * H + row] : 0.0f);
        __global const float* r = Rd + (long)row * H;
        for (int k = 0; k < H; ++k) s = mad(r[k], h[k], s);
        acc[q] = s;
      }
      const float i = sigmoidf(acc[0]), o = sigmoidf(acc[1]), f = sigmoidf(acc[2]);
      const float cn = f * c[j] + i * tanh(acc[3]);
      c[j] = cn;
      const float hv = o * tanh(cn);
      hn[j] = hv;
      Y[(((long)t * D + d) * B + b) * H + j] = hv;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = lid; j < H; j += size) h[j] = hn[j];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int j = lid; j < H; j += size) Yh[((long)d * B + b) * H + j] = h[j];
}
