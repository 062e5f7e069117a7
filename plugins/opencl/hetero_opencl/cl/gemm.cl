// The tiled GEMM behind MatMul, Gemm, FusedMatMul, Conv (im2col), ConvTranspose and prefill QMatMul.
// C[b] = act(alpha * A[b] @ B[b] + beta * bias) for b = get_global_id(2). Element (m, k) of A[b] is
// A[offs[2b] + m * sam + k * sak] (strides express transposes), (k, n) of B[b] is B[offs[2b+1] + k * sbk + n * sbn];
// C is contiguous [M, N] per batch at c_off + b * M * N; bias (m, n) at bias[b * sbb + m * scm + n * scn].
//
// Shape of the tiling, set by the host per device (tuned once, cached: hetero_opencl.kernels.gemm.CONFIGS):
// a WGX x WGY work-group computes a TM x TN tile, each work-item an RY x RX block of it; K is walked TK at a time
// through local memory.
#ifndef WGX
#define WGX 8
#define WGY 8
#define RX 4
#define RY 4
#define TK 16
#endif
#define TN (WGX * RX)
#define TM (WGY * RY)

__kernel __attribute__((reqd_work_group_size(WGX, WGY, 1)))
void gemm(__global const float* A, __global const float* B, __global float* C, __global const float* bias,
          __global const int* offs, int M, int N, int K, int sam, int sak, int sbk, int sbn, int c_off,
          float alpha, float beta, int has_bias, int sbb, int scm, int scn, int act, float act_a, float act_b) {
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int lid = ty * WGX + tx;
  const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
  const int batch = get_global_id(2);
  A += offs[2 * batch];
  B += offs[2 * batch + 1];
  C += c_off + (long)batch * M * N;
  __local float As[TK][TM];
  __local float Bs[TK][TN];
  float acc[RY][RX];
  for (int r = 0; r < RY; ++r)
    for (int c = 0; c < RX; ++c) acc[r][c] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int i = lid; i < TK * TM; i += WGX * WGY) {
      const int m = i / TK, k = i % TK, gm = m0 + m, gk = k0 + k;
      As[k][m] = (gm < M && gk < K) ? A[(long)gm * sam + (long)gk * sak] : 0.0f;
    }
    for (int i = lid; i < TK * TN; i += WGX * WGY) {
      const int k = i / TN, n = i % TN, gk = k0 + k, gn = n0 + n;
      Bs[k][n] = (gk < K && gn < N) ? B[(long)gk * sbk + (long)gn * sbn] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < TK; ++k) {
      float a[RY], b[RX];
      for (int r = 0; r < RY; ++r) a[r] = As[k][ty * RY + r];
      for (int c = 0; c < RX; ++c) b[c] = Bs[k][tx * RX + c];
      for (int r = 0; r < RY; ++r)
        for (int c = 0; c < RX; ++c) acc[r][c] = mad(a[r], b[c], acc[r][c]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int r = 0; r < RY; ++r) {
    const int m = m0 + ty * RY + r;
    if (m >= M) break;
    for (int c = 0; c < RX; ++c) {
      const int n = n0 + tx * RX + c;
      if (n >= N) break;
      float v = alpha * acc[r][c];
      if (has_bias) v += beta * bias[(long)batch * sbb + (long)m * scm + (long)n * scn];
      C[(long)m * N + n] = activate(v, act, act_a, act_b);
    }
  }
}
