// LSTM and GRU: the input projections of all time steps in one packed GEMM (X (seq*batch, I) times W^T), then
// the recurrence step by step: H_{t-1} R^T on the packed GEMM (small-M path), gate activations through the ISA
// table's vector sigmoid / tanh, and the cell update. Directions forward / reverse / bidirectional, per-batch
// sequence lengths, initial states, LSTM peepholes and input_forget, GRU linear_before_reset, clip.
// Default activations only (Sigmoid / Tanh); the Python side sends other configurations to the numpy reference.
// Precision "normal" (rnn_prepack's bf16x3) runs the input projections as bf16x3 on AMX-BF16 (gemm_bf16x3.hpp), as
// MatMul / Gemm on packed weights do; the recurrent products (M = batch <= 4) stay on the fp32 small-M path. A
// bidirectional layer runs its two directions on two threads (each direction's steps in its own order, so the bits
// do not depend on the thread count); at one thread an int8 one of batch 1 interleaves them (run_pair).
// Quantized mode (com.microsoft::DynamicQuantizeLSTM, rnn_prepack_q): W and R stay 8-bit, packed for the integer
// GEMM of the quantized ONNX ops (qlinear.hpp: vpdpbusd / AMX, exact int32 sums with the zero points folded in), and
// each product's activations are quantized on the fly as onnxruntime does at one thread: X once over all its steps,
// H once a step over the whole batch, to uint8 with the range widened to hold 0; the int32 sums leave scaled by the
// activation's scale times the weight's column scale. A step's recurrent product runs in slices of hidden units, one
// a thread (each slice the four gates' columns of its units, then those units' gate math), its column panels in
// alternating order step by step (the end of R read last stays in L2 for the next step's start); the bits do not
// depend on the slicing (exact integer sums, a per-element epilogue and gate math).
// Token mode (hetero::EmbeddingRNN, float weights): X is an embedding's rows, so rnn_project multiplies the whole table
// by each direction's W^T once and rnn_run_tokens gathers each step's projected rows (plus the bias) instead of the
// input projection's GEMM; the GEMM's sums are per row, so the bits are those of the layer on the gathered rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gemm_bf16x3.hpp"
#include "onnx_py.hpp"
#include "qlinear.hpp"

namespace hetero {
namespace {

using namespace pyx;

struct Packed {
  i64 k = 0, n = 0;
  AlignedBuf buf;
  // bf16x3 hi then lo (gemm_bf16x3.hpp), when asked for, available, and B splits (no NaN / inf / huge value)
  AlignedBuf bf;
  float bf_max = 0.f;
  bool bf16x3 = false;
  void pack(const Kernels& kr, const MatView& b, bool want_bf16x3 = false) {
    k = b.rows;
    n = b.cols;
    buf.get(static_cast<std::size_t>(std::max<i64>(1, ceil_div(n, kr.nr) * kr.nr * k)));
    pack_b_panels(kr, b, buf.p, 1);
    if (want_bf16x3 && &kr == kernels_avx512() && bf16x3_available() && bf16x3_worth(kBf16x3MinRows, n, k)) {
      const i64 part = bf16x3_b_values(k, n);
      auto* hi = reinterpret_cast<std::uint16_t*>(bf.get(static_cast<std::size_t>(part)));
      bf16x3 = bf16x3_pack_b(b, hi, hi + part, &bf_max);
      if (!bf16x3) bf.reset();
    }
  }
  Bf16x3B bf16x3_b() const {
    const auto* hi = reinterpret_cast<const std::uint16_t*>(bf.p);
    return Bf16x3B{hi, hi + bf16x3_b_values(k, n), k, n, bf_max};
  }
};

struct RnnWeights {
  const Kernels* kr = nullptr;
  bool gru = false;
  // >= 0: the plain RNN (one gate, H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)) with f this unary op (U_TANH, U_RELU
  // or U_SIGMOID); -1: LSTM or GRU
  int simple_act = -1;
  i64 dirs = 0, I = 0, H = 0, G = 0;
  std::vector<std::unique_ptr<Packed>> w, r, rh;  // per direction: W^T, R^T (LSTM: all gates; GRU: z and r), GRU R_h^T
  // quantized mode: per direction W and R as 8-bit panels, their (dirs, G*H) column scales; empty otherwise
  std::vector<std::unique_ptr<qlin::QPacked>> qw, qr;
  std::vector<float> w_scale, r_scale;
};

// Dynamic uint8 quantization of rows x k floats (ld apart) into rows of lda bytes (zero past k), the range widened
// to hold 0, the zero point and values rounded half to even; returns the scale, *zp the zero point.
// Many rows (all steps of X) in chunks on the pool while its workers are awake: min / max are exact in any order and
// each value is quantized alone, so the bytes do not depend on the chunking.
float quantize_rows_u8(const float* a, i64 rows, i64 k, i64 ld, std::uint8_t* out, i64 lda, std::int32_t* zp) {
  const qlin::QKernels& qk = qlin::qk();
  const int chunks = static_cast<int>(std::min<i64>(rows, threads_for(static_cast<double>(rows * k), 32768.0)));
  // one chunk (an LSTM step's H, every step): no heap for the per-chunk ranges (a step's own cost is a few us)
  float lo1 = 0.f, hi1 = 0.f;
  std::vector<float> lo_many, hi_many;
  if (chunks > 1) {
    lo_many.assign(static_cast<std::size_t>(chunks), 0.f);
    hi_many.assign(lo_many.size(), 0.f);
  }
  float* lo = chunks > 1 ? lo_many.data() : &lo1;
  float* hi = chunks > 1 ? hi_many.data() : &hi1;
  auto rows_of = [&](i64 c, i64& r0, i64& r1) {
    r0 = rows * c / chunks;
    r1 = rows * (c + 1) / chunks;
  };
  auto range_of = [&](i64 c) {
    i64 r0, r1;
    rows_of(c, r0, r1);
    for (i64 r = r0; r < r1 && k > 0; ++r) {
      float l = 0.f, h = 0.f;
      qk.minmax(a + r * ld, k, &l, &h);
      lo[c] = std::min(lo[c], l);
      hi[c] = std::max(hi[c], h);
    }
  };
  parallel_for(chunks, chunks, range_of, false);
  const float l = *std::min_element(lo, lo + std::max(chunks, 1)), h = *std::max_element(hi, hi + std::max(chunks, 1));
  const float scale = h > l ? (h - l) / 255.f : 1.f;
  *zp = static_cast<std::int32_t>(std::min(255.f, std::max(0.f, std::nearbyint(-l / scale))));
  auto quantize_chunk = [&](i64 c) {
    i64 r0, r1;
    rows_of(c, r0, r1);
    for (i64 r = r0; r < r1; ++r) {
      std::uint8_t* o = out + r * lda;
      qk.quantize8(a + r * ld, k, scale, *zp, 0, 255, o);
      if (lda > k) std::memset(o + k, 0, static_cast<std::size_t>(lda - k));
    }
  };
  parallel_for(chunks, chunks, quantize_chunk, false);
  return scale;
}

// c (M x N, ldc) = a (M x K view) @ packed + bias row (may be null).
void gemm_p(const Kernels& kr, const MatView& a, const Packed& p, float* c, i64 ldc, const float* bias, int T) {
  if (a.rows == 0 || p.n == 0) return;
  Epilogue ep;
  if (bias) {
    ep.bias = bias;
    ep.bias_rs = 0;
    ep.bias_cs = 1;
  }
  if (p.bf16x3 && bf16x3_worth(a.rows, p.n, p.k) && bf16x3_gemm(kr, p.bf16x3_b(), a, c, ldc, 1.f, 0.f, ep, T)) return;
  if (a.rows <= 4)
    gemm_small_m_packed(kr, a, p.buf.p, p.n, c, ldc, 1.f, 0.f, ep, T);
  else
    gemm_prepacked_b(kr, a.rows, p.n, p.k, &a, nullptr, p.buf.p, c, ldc, 1.f, 0.f, ep, T);
}

const float* opt_f32(const py::object& o, i64 n, const char* fn, const char* name) {
  if (o.is_none()) return nullptr;
  py::array a = py::reinterpret_borrow<py::array>(o);
  need_f32(a, fn, name);
  need_contig(a, fn, name);
  if (a.size() != n) fail(std::string(fn) + ": " + name + " must have " + std::to_string(n) + " elements");
  return cptr<float>(a);
}

std::shared_ptr<RnnWeights> py_rnn_prepack(const py::array& W, const py::array& R, bool gru, bool bf16x3,
                                           const std::string& simple) {
  const char* fn = "rnn_prepack";
  need_f32(W, fn, "W");
  need_f32(R, fn, "R");
  need_contig(W, fn, "W");
  need_contig(R, fn, "R");
  if (W.ndim() != 3 || R.ndim() != 3) fail("rnn_prepack: W and R must be 3-D (dirs, gates*hidden, ...)");
  auto p = std::make_shared<RnnWeights>();
  p->kr = &active();
  p->gru = gru;
  p->G = gru ? 3 : 4;
  if (!simple.empty()) {  // the plain RNN: one gate and its activation
    if (gru) fail("rnn_prepack: gru and simple exclude each other");
    if (simple == "tanh") p->simple_act = U_TANH;
    else if (simple == "relu") p->simple_act = U_RELU;
    else if (simple == "sigmoid") p->simple_act = U_SIGMOID;
    else fail("rnn_prepack: simple must be \"tanh\", \"relu\" or \"sigmoid\", got \"" + simple + "\"");
    p->G = 1;
  }
  p->dirs = W.shape(0);
  p->H = R.shape(2);
  p->I = W.shape(2);
  if (R.shape(0) != p->dirs || W.shape(1) != p->G * p->H || R.shape(1) != p->G * p->H)
    fail("rnn_prepack: W is " + shape_str(W) + " and R is " + shape_str(R) + ", inconsistent with " +
         std::to_string(p->G) + " gates");
  const float* pw = cptr<float>(W);
  const float* pr = cptr<float>(R);
  const i64 GH = p->G * p->H, H = p->H, I = p->I;
  py::gil_scoped_release nogil;
  for (i64 d = 0; d < p->dirs; ++d) {
    p->w.push_back(std::make_unique<Packed>());
    p->w.back()->pack(*p->kr, MatView{pw + d * GH * I, I, GH, 1, I}, bf16x3);
    const float* rd = pr + d * GH * H;
    p->r.push_back(std::make_unique<Packed>());
    p->r.back()->pack(*p->kr, MatView{rd, H, gru ? 2 * H : GH, 1, H});
    p->rh.push_back(std::make_unique<Packed>());
    if (gru) p->rh.back()->pack(*p->kr, MatView{rd + 2 * H * H, H, H, 1, H});
  }
  return p;
}

// DynamicQuantizeLSTM's weights: W (dirs, I, 4H) and R (dirs, H, 4H), both int8 or both uint8; zero points int32 and
// scales float32, each (dirs, 4H) (per-tensor values repeated).
std::shared_ptr<RnnWeights> py_rnn_prepack_q(const py::array& W, const py::array& R, const py::array& w_zp,
                                             const py::array& r_zp, const py::array& w_scale,
                                             const py::array& r_scale) {
  const char* fn = "rnn_prepack_q";
  need_contig(W, fn, "W");
  need_contig(R, fn, "R");
  const std::string wk = pyx::dkey(W), rk = pyx::dkey(R);
  if ((wk != "i1" && wk != "u1") || rk != wk) fail("rnn_prepack_q: W and R must be both int8 or both uint8");
  if (W.ndim() != 3 || R.ndim() != 3) fail("rnn_prepack_q: W and R must be 3-D");
  auto p = std::make_shared<RnnWeights>();
  p->kr = &active();
  p->G = 4;
  p->dirs = W.shape(0);
  p->I = W.shape(1);
  p->H = R.shape(1);
  const i64 GH = 4 * p->H, I = p->I, H = p->H, n = p->dirs * GH;
  if (R.shape(0) != p->dirs || W.shape(2) != GH || R.shape(2) != GH)
    fail("rnn_prepack_q: W is " + shape_str(W) + " and R is " + shape_str(R) + ", not (dirs, I, 4H) and (dirs, H, 4H)");
  py::array_t<std::int32_t, py::array::c_style | py::array::forcecast> wz(w_zp), rz(r_zp);
  if (wz.size() != n || rz.size() != n) fail("rnn_prepack_q: zero points must have dirs * 4H values");
  const float* ws = opt_f32(w_scale, n, fn, "w_scale");
  const float* rs = opt_f32(r_scale, n, fn, "r_scale");
  p->w_scale.assign(ws, ws + n);
  p->r_scale.assign(rs, rs + n);
  const auto* pw = static_cast<const std::uint8_t*>(W.data());
  const auto* pr = static_cast<const std::uint8_t*>(R.data());
  const bool u8 = wk == "u1";
  for (i64 d = 0; d < p->dirs; ++d) {
    p->qw.push_back(std::make_unique<qlin::QPacked>());
    p->qw.back()->k = I;
    p->qw.back()->n = GH;
    qlin::pack_into(*p->qw.back(), pw + d * I * GH, GH, 1, u8, wz.data() + d * GH, GH);
    p->qr.push_back(std::make_unique<qlin::QPacked>());
    p->qr.back()->k = H;
    p->qr.back()->n = GH;
    qlin::pack_into(*p->qr.back(), pr + d * H * GH, GH, 1, u8, rz.data() + d * GH, GH);
  }
  return p;
}

// An embedding table's rows already projected (rnn_project: table (V, I) times each direction's W^T, no bias), and
// the token ids that pick them: the layer's input projection becomes a gather (hetero::EmbeddingRNN).
struct TokenRows {
  const float* proj = nullptr;        // (V, dirs, G*H)
  const std::int64_t* ids = nullptr;  // (seq, batch), or (batch, seq) when batch_major; in [0, V)
  bool batch_major = false;
  i64 id(i64 t, i64 b, i64 seq, i64 batch) const { return ids[batch_major ? b * seq + t : t * batch + b]; }
};

// (V, dirs, G*H) = table (V, I) times each direction's W^T on the same packed GEMM as the layer's input projection
// (no bias: the run adds it, as the projection's epilogue does).
py::array_t<float> py_rnn_project(const RnnWeights& p, const py::array& table) {
  const char* fn = "rnn_project";
  need_f32(table, fn, "table");
  need_contig(table, fn, "table");
  if (!p.qw.empty()) fail("rnn_project: float weights only (rnn_prepack)");
  if (table.ndim() != 2 || table.shape(1) != p.I) fail("rnn_project: table must be (V, " + std::to_string(p.I) + ")");
  const i64 V = table.shape(0), GH = p.G * p.H;
  py::array_t<float> out({V, p.dirs, GH});
  const float* pt = cptr<float>(table);
  float* po = out.mutable_data();
  py::gil_scoped_release nogil;
  for (i64 d = 0; d < p.dirs; ++d)
    gemm_p(*p.kr, MatView{pt, V, p.I, p.I, 1}, *p.w[static_cast<std::size_t>(d)], po + d * GH, p.dirs * GH, nullptr,
           num_threads());
  return out;
}

// direction: 0 forward, 1 reverse, 2 bidirectional. px: X (seq, batch, I), or null with tok's rows instead;
// Y (seq, dirs, batch, H) or None; Y_h / Y_c (dirs, batch, H) or None.
void rnn_run_impl(const RnnWeights& p, const float* px, const TokenRows& tok, i64 seq, i64 batch,
                  const py::object& B, const py::object& lens_obj, const py::object& h0, const py::object& c0,
                  const py::object& P, int direction, float clip, bool input_forget, bool linear_before_reset,
                  const py::object& Y, const py::object& Yh, const py::object& Yc) {
  const char* fn = "rnn_run";
  const i64 H = p.H, G = p.G, GH = G * H, dirs = p.dirs, I = p.I;
  if ((direction == 2) != (dirs == 2)) fail("rnn_run: direction does not match the packed weights");
  const float* pB = opt_f32(B, dirs * 2 * GH, fn, "B");
  const float* ph0 = opt_f32(h0, dirs * batch * H, fn, "initial_h");
  const bool lstm = !p.gru && p.simple_act < 0;  // a cell state (initial_c, P, Y_c)
  const float* pc0 = lstm ? opt_f32(c0, dirs * batch * H, fn, "initial_c") : nullptr;
  const float* pP = lstm ? opt_f32(P, dirs * 3 * H, fn, "P") : nullptr;
  std::vector<std::int64_t> lens(static_cast<std::size_t>(batch), seq);
  if (!lens_obj.is_none()) {
    py::array l = py::reinterpret_borrow<py::array>(lens_obj);
    if (l.size() != batch) fail("rnn_run: sequence_lens must have batch elements");
    py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> li(l);
    for (i64 b = 0; b < batch; ++b) {
      const std::int64_t v = li.data()[b];
      if (v < 0 || v > seq) fail("rnn_run: sequence_lens value " + std::to_string(v) + " outside [0, seq]");
      lens[static_cast<std::size_t>(b)] = v;
    }
  }
  auto out_ptr = [&](const py::object& o, i64 n, const char* name) -> float* {
    if (o.is_none()) return nullptr;
    py::array a = py::reinterpret_borrow<py::array>(o);
    need_f32(a, fn, name);
    need_out(a, fn, name);
    if (a.size() != n) fail(std::string(fn) + ": " + name + " must have " + std::to_string(n) + " elements");
    return mptr<float>(a);
  };
  float* pY = out_ptr(Y, seq * dirs * batch * H, "Y");
  float* pYh = out_ptr(Yh, dirs * batch * H, "Y_h");
  float* pYc = lstm ? out_ptr(Yc, dirs * batch * H, "Y_c") : nullptr;
  py::gil_scoped_release nogil;
  const Kernels& kr = *p.kr;
  const bool do_clip = clip > 0.f;
  const bool quant = !p.qw.empty();
  // Quantized mode: X quantized once for both directions (onnxruntime's input product covers all steps at once).
  const i64 xlda = 4 * ((I + 3) / 4);
  std::vector<std::uint8_t> xq(quant ? static_cast<std::size_t>(std::max<i64>(1, seq * batch * xlda)) : 0);
  std::int32_t x_zp = 0;
  const float x_scale = quant ? quantize_rows_u8(px, seq * batch, I, I, xq.data(), xlda, &x_zp) : 1.f;
  // Y's steps past a row's sequence_lens stay 0; every other value is written by its step (no pass over Y then)
  if (pY && std::any_of(lens.begin(), lens.end(), [&](std::int64_t v) { return v < seq; })) std::fill(pY, pY + seq * dirs * batch * H, 0.f);
  auto act = [&](int op, float* v, i64 n) {
    if (do_clip) kr.unary(U_CLIP, v, v, n, -clip, clip);
    kr.unary(op, v, v, n, 0.f, 0.f);
  };
  // One direction, its products on T threads; writes only its own slices of Y / Y_h / Y_c.
  auto run_direction = [&](i64 d, int T) {
    // every step's input projection (written whole below): this thread's grow-only buffer, not a zeroed vector (a
    // 768-wide layer's 80 x 3 steps are 2.9 MB: a memset and its page faults at every call)
    float* xw = tl_buf(TL_MISC).get(static_cast<std::size_t>(std::max<i64>(1, seq * batch * GH)));
    std::vector<float> hr(static_cast<std::size_t>(std::max<i64>(1, batch * GH)));
    std::vector<float> hh(static_cast<std::size_t>(std::max<i64>(1, batch * H)));
    std::vector<float> rh(static_cast<std::size_t>(std::max<i64>(1, batch * H)));
    std::vector<float> h(static_cast<std::size_t>(std::max<i64>(1, batch * H))), c(h.size()),
        tmp(static_cast<std::size_t>(H + 1));
    std::vector<float> bx(static_cast<std::size_t>(GH)), brh(static_cast<std::size_t>(H));
    const bool backward = direction == 1 || d == 1;
    // Input-side bias: Wb + Rb, except the GRU candidate's Rb under linear_before_reset (applied inside r * (.)).
    for (i64 j = 0; j < GH; ++j) {
      const float wb = pB ? pB[d * 2 * GH + j] : 0.f, rb = pB ? pB[d * 2 * GH + GH + j] : 0.f;
      bx[static_cast<std::size_t>(j)] = (p.gru && linear_before_reset && j >= 2 * H) ? wb : wb + rb;
    }
    for (i64 j = 0; j < H; ++j) brh[static_cast<std::size_t>(j)] = pB ? pB[d * 2 * GH + GH + 2 * H + j] : 0.f;
    const i64 hlda = 4 * ((H + 3) / 4);
    // A step's product on AMX from 3 rows (H whole 64-byte tile rows; hq's rows padded to whole 16-row tiles, zeros
    // past batch): AMX reads R at ~45 GB/s whatever the rows, the vector tiles are faster for 1-2 rows and bound by
    // vpdpbusd from 3 (1 thread, H 768, a step: 41 / 59 / 83-92 us for 1 / 2 / 3 rows against AMX's 54 / 66 / 74-85).
    const bool step_amx = quant && batch >= 3 && H % 64 == 0 && &qlin::qk() == qlin::qkernels_avx512vnni() &&
                          qlin::amx_available();
    const i64 hq_rows = step_amx ? ceil_div(batch, 16) * 16 : batch;
    std::vector<std::uint8_t> hq(quant ? static_cast<std::size_t>(hq_rows * hlda) : 0);
    std::vector<float> col(quant ? static_cast<std::size_t>(GH) : 0);  // a product's column multipliers
    // int32 sums -> float32(sum) * col[j] (+ bias[j]) into out (rows GH apart)
    auto qstage = [&](float* out, const float* bias) {
      qlin::OutStage st;
      st.kind = qlin::OutStage::F32;
      st.out = out;
      st.rs = GH;
      st.cs = 1;
      st.scale = col.data();
      st.fbias = bias;
      return st;
    };
    if (quant) {
      const float* ws = p.w_scale.data() + d * GH;
      for (i64 j = 0; j < GH; ++j) col[static_cast<std::size_t>(j)] = x_scale * ws[j];
      qlin::qgemm(*p.qw[static_cast<std::size_t>(d)], qlin::AOperand{xq.data(), xlda, &x_zp, 1}, seq * batch,
                  qstage(xw, bx.data()));
    } else if (tok.proj) {
      for (i64 t = 0; t < seq; ++t)
        for (i64 b = 0; b < batch; ++b)
          kr.binary(B_ADD, BM_VV, tok.proj + (tok.id(t, b, seq, batch) * dirs + d) * GH, bx.data(),
                    xw + (t * batch + b) * GH, GH);
    } else {
      gemm_p(kr, MatView{px, seq * batch, I, I, 1}, *p.w[static_cast<std::size_t>(d)], xw, GH, bx.data(), T);
    }
    if (ph0) std::memcpy(h.data(), ph0 + d * batch * H, static_cast<std::size_t>(batch * H) * sizeof(float));
    else std::fill(h.begin(), h.end(), 0.f);
    if (pc0) std::memcpy(c.data(), pc0 + d * batch * H, static_cast<std::size_t>(batch * H) * sizeof(float));
    else std::fill(c.begin(), c.end(), 0.f);
    const float* pp = pP ? pP + d * 3 * H : nullptr;
    const Packed* Rp = quant ? nullptr : p.r[static_cast<std::size_t>(d)].get();
    // LSTM gate math of one batch row over hidden units [j0, j0 + n): g (the row's i, o, f, c pre-activations, H
    // apart) plus xr (the input side, same layout), then units j0.. of the cell cb and hidden hb (elementwise, so a
    // slice of units computes what the whole row computes for them).
    auto lstm_cell = [&](float* g, const float* xr, float* cb, float* hb, i64 j0, i64 n) {
      for (i64 q = 0; q < 4; ++q) kr.binary(B_ADD, BM_VV, g + q * H + j0, xr + q * H + j0, g + q * H + j0, n);
      float* gi = g + j0;
      float* go = g + H + j0;
      float* gf = g + 2 * H + j0;
      float* gc = g + 3 * H + j0;
      float* cj = cb + j0;
      const float* pj = pp ? pp + j0 : nullptr;
      if (pj)
        for (i64 j = 0; j < n; ++j) {
          gi[j] += pj[j] * cj[j];
          gf[j] += pj[2 * H + j] * cj[j];
        }
      act(U_SIGMOID, gi, n);
      if (!input_forget) act(U_SIGMOID, gf, n);
      act(U_TANH, gc, n);
      for (i64 j = 0; j < n; ++j) {
        const float f = input_forget ? 1.f - gi[j] : gf[j];
        cj[j] = f * cj[j] + gi[j] * gc[j];
      }
      if (pj)
        for (i64 j = 0; j < n; ++j) go[j] += pj[H + j] * cj[j];
      act(U_SIGMOID, go, n);
      float* th = tmp.data() + j0;
      kr.unary(U_TANH, cj, th, n, 0.f, 0.f);
      for (i64 j = 0; j < n; ++j) hb[j0 + j] = go[j] * th[j];
    };
    // Quantized mode: a step in S slices of hidden units (whole 16-unit blocks), each the items (<= np panels of one
    // gate's columns of its units) of R^T hq, then its units' gate math.
    struct QItem {
      i64 p0;
      int np;
      i64 nlo, nhi;  // the columns it finishes
    };
    const qlin::QKernels& kq = qlin::qk();
    const qlin::QPacked* Rq = quant ? p.qr[static_cast<std::size_t>(d)].get() : nullptr;
    const i64 units16 = ceil_div(H, 16);
    int S = 1;
    if (quant && T > 1) {
      const double step_bytes = static_cast<double>(H) * static_cast<double>(GH);
      const double step_flops = 2.0 * static_cast<double>(batch) * step_bytes;
      S = std::min(T, std::max(threads_for(step_flops, 1e6), threads_for(step_bytes, kSmallMSplitBytes)));
      S = static_cast<int>(std::min<i64>(S, units16));
    }
    // a small split wakes no sleeping worker (the first steps then run on the caller; the spinning worker joins)
    const bool wake =
        quant && static_cast<double>(seq) * static_cast<double>(H) * static_cast<double>(GH) >= 512.0 * 1024;
    std::vector<std::vector<QItem>> items(static_cast<std::size_t>(S));
    std::vector<i64> unit0(static_cast<std::size_t>(S) + 1);
    for (int s = 0; s <= S; ++s) unit0[static_cast<std::size_t>(s)] = std::min(H, (units16 * s / S) * 16);
    if (quant)
      for (int s = 0; s < S; ++s)
        for (i64 q = 0; q < 4; ++q) {
          const i64 a = q * H + unit0[static_cast<std::size_t>(s)], e = q * H + unit0[static_cast<std::size_t>(s) + 1];
          for (i64 p0 = a / qlin::kPanel; p0 * qlin::kPanel < e; p0 += kq.np) {
            const int np = static_cast<int>(std::min<i64>(kq.np, ceil_div(e, qlin::kPanel) - p0));
            items[static_cast<std::size_t>(s)].push_back(
                QItem{p0, np, std::max(a, p0 * qlin::kPanel), std::min(e, (p0 + np) * qlin::kPanel)});
          }
        }
    std::vector<std::int32_t> hrow(quant ? static_cast<std::size_t>(batch) : 0);  // hq's row sums
    // The default gates on the avx512vnni tiles (any batch, H % 16 == 0): a step's tiles keep their raw int32 sums
    // (rows ldq apart) and each batch row's cells are one pass of Kernels::lstm_q_pair's cell blocks (the F32 stage,
    // the input side, the gates and the cell in registers), where finish + lstm_cell took ~12 passes over the row
    // (~10 us of a 3-row, H 768 step beside its ~31 us tile). The same operations per value, so the same bits.
    const bool fused_cells = quant && !step_amx && H % 16 == 0 && kr.lstm_q_pair &&
                             &kq == qlin::qkernels_avx512vnni() && !pP && !do_clip && !input_forget;
    const i64 ldq = fused_cells ? Rq->panels * qlin::kPanel : 0;
    // avx2: R's pair-safe copy on the vpmaddubsw tile where pack_into kept one (about half the widening tile's work)
    const qlin::PairSafe* r_pairs = quant && !step_amx && !fused_cells ? qlin::pair_safe(kq, *Rq) : nullptr;
    std::vector<std::int32_t> rawq(static_cast<std::size_t>(batch * ldq));
    for (i64 t = 0; t < seq; ++t) {
      const i64 rn = quant ? GH : Rp->n;  // LSTM: 4H, GRU: 2H, RNN: H
      if (quant) {
        std::int32_t h_zp = 0;
        const float h_scale = quantize_rows_u8(h.data(), batch, H, H, hq.data(), hlda, &h_zp);
        const float* rs = p.r_scale.data() + d * GH;
        for (i64 j = 0; j < GH; ++j) col[static_cast<std::size_t>(j)] = h_scale * rs[j];
        kq.rowsums(hq.data(), batch, H, hlda, hrow.data());
        const qlin::Corrections cr{Rq->colsum.data(), Rq->zb.data(), hrow.data(), &h_zp, 1, Rq->k};
        const qlin::OutStage st = qstage(hr.data(), nullptr);
        // each slice: its items (in alternating order), then its units' gates; hq, cr, st and col are read-only here
        auto slice = [&](i64 s) {
          const std::vector<QItem>& its = items[static_cast<std::size_t>(s)];
          const i64 n_items = static_cast<i64>(its.size());
          alignas(64) std::int32_t raw[16 * qlin::kNP * qlin::kPanel];
          const i64 row_step = step_amx ? 16 : (r_pairs ? qlin::kMR : kq.mr);
          if (step_amx) qlin::amx_begin();
          for (i64 e = 0; e < n_items; ++e) {
            const QItem& it = its[static_cast<std::size_t>((t & 1) ? n_items - 1 - e : e)];
            const i64 ldc = it.np * qlin::kPanel;
            const std::int8_t* b = Rq->data->p + it.p0 * Rq->pstride();
            for (i64 m0 = 0; m0 < batch; m0 += row_step) {
              const int mr = static_cast<int>(std::min<i64>(row_step, batch - m0));
              if (fused_cells) {
                kq.tile(mr, it.np, Rq->k4, hq.data() + m0 * hlda, hlda, b, Rq->pstride(),
                        rawq.data() + m0 * ldq + it.p0 * qlin::kPanel, ldq);
                continue;
              }
              if (step_amx)
                qlin::amx_panels16(Rq->k, it.np, hq.data() + m0 * hlda, hlda, b, Rq->pstride(), raw, ldc);
              else
                qlin::tile_raw(kq, *Rq, r_pairs, mr, it.np, it.p0, hq.data() + m0 * hlda, hlda, raw, ldc);
              kq.finish(st, cr, m0, mr, it.nlo, static_cast<int>(it.nhi - it.nlo),
                        raw + (it.nlo - it.p0 * qlin::kPanel), ldc);
            }
          }
          if (step_amx) qlin::amx_end();
          const i64 j0 = unit0[static_cast<std::size_t>(s)], n = unit0[static_cast<std::size_t>(s) + 1] - j0;
          for (i64 b = 0; b < batch; ++b) {
            const i64 len = lens[static_cast<std::size_t>(b)];
            if (t >= len) continue;
            const i64 tx = backward ? len - 1 - t : t;
            float* yb = pY ? pY + ((tx * dirs + d) * batch + b) * H + j0 : nullptr;
            if (fused_cells) {
              LstmQPair a;
              a.H = H;
              a.units = n;
              a.raw_in = rawq.data() + b * ldq + j0;
              a.colsum = Rq->colsum.data() + j0;
              a.zb = Rq->zb.data() + j0;
              a.za = h_zp;
              a.rowsum = hrow[static_cast<std::size_t>(b)];
              a.K = Rq->k;
              a.col = col.data() + j0;
              a.xw = xw + (tx * batch + b) * GH + j0;
              a.c = c.data() + b * H + j0;
              a.h = h.data() + b * H + j0;
              a.y = yb;
              kr.lstm_q_pair(a);
              continue;
            }
            lstm_cell(hr.data() + b * GH, xw + (tx * batch + b) * GH, c.data() + b * H, h.data() + b * H, j0,
                      n);
            if (pY)
              std::memcpy(pY + ((tx * dirs + d) * batch + b) * H + j0, h.data() + b * H + j0,
                          static_cast<std::size_t>(n) * sizeof(float));
          }
        };
        parallel_for(S, S, slice, wake);
        continue;
      }
      gemm_p(kr, MatView{h.data(), batch, H, H, 1}, *Rp, hr.data(), rn, nullptr, T);
      const MatView hv{h.data(), batch, H, H, 1};
      if (p.gru && linear_before_reset)
        gemm_p(kr, hv, *p.rh[static_cast<std::size_t>(d)], hh.data(), H, brh.data(), T);
      for (i64 b = 0; b < batch; ++b) {
        const i64 len = lens[static_cast<std::size_t>(b)];
        if (t >= len) continue;
        const i64 tx = backward ? len - 1 - t : t;
        float* g = hr.data() + b * rn;
        const float* xr = xw + (tx * batch + b) * GH;
        float* hb = h.data() + b * H;
        if (p.simple_act >= 0) {  // the plain RNN: f(clip(x W^T + Wb + Rb + h R^T))
          kr.binary(B_ADD, BM_VV, g, xr, g, H);
          act(p.simple_act, g, H);
          std::memcpy(hb, g, static_cast<std::size_t>(H) * sizeof(float));
        } else if (!p.gru) {
          lstm_cell(g, xr, c.data() + b * H, hb, 0, H);
        } else {
          kr.binary(B_ADD, BM_VV, g, xr, g, 2 * H);
          act(U_SIGMOID, g, 2 * H);  // z, r
          if (!linear_before_reset) {
            float* rr = rh.data() + b * H;
            for (i64 j = 0; j < H; ++j) rr[j] = g[H + j] * hb[j];
          }
        }
      }
      if (p.gru) {
        if (!linear_before_reset)
          gemm_p(kr, MatView{rh.data(), batch, H, H, 1}, *p.rh[static_cast<std::size_t>(d)], hh.data(), H, nullptr, T);
        for (i64 b = 0; b < batch; ++b) {
          const i64 len = lens[static_cast<std::size_t>(b)];
          if (t >= len) continue;
          const i64 tx = backward ? len - 1 - t : t;
          const float* g = hr.data() + b * rn;
          const float* xh = xw + (tx * batch + b) * GH + 2 * H;
          const float* q = hh.data() + b * H;
          float* cand = tmp.data();
          for (i64 j = 0; j < H; ++j) cand[j] = linear_before_reset ? xh[j] + g[H + j] * q[j] : xh[j] + q[j];
          act(U_TANH, cand, H);
          float* hb = h.data() + b * H;
          for (i64 j = 0; j < H; ++j) hb[j] = (1.f - g[j]) * cand[j] + g[j] * hb[j];
        }
      }
      if (pY)
        for (i64 b = 0; b < batch; ++b) {
          const i64 len = lens[static_cast<std::size_t>(b)];
          if (t >= len) continue;
          const i64 tx = backward ? len - 1 - t : t;
          std::memcpy(pY + ((tx * dirs + d) * batch + b) * H, h.data() + b * H, static_cast<std::size_t>(H) * sizeof(float));
        }
    }
    if (pYh) std::memcpy(pYh + d * batch * H, h.data(), static_cast<std::size_t>(batch * H) * sizeof(float));
    if (pYc) std::memcpy(pYc + d * batch * H, c.data(), static_cast<std::size_t>(batch * H) * sizeof(float));
  };
  // Quantized, bidirectional, batch 1, one thread: the two directions' steps interleaved, each call of
  // Kernels::lstm_q_pair one direction's step tile (R^T hq: R read from L2, at Zen 4's ~32 B a cycle with vpdpbusd
  // half idle) with the other direction's cells of its previous tile between the tile's items, so the out-of-order
  // core runs the gate arithmetic in the cycles the tile waits on L2 (run_direction does a step's cells after its
  // tile: ~1 us beside the tile's ~2 us at H 256). The same integer sums and per-value operations as run_direction,
  // so the same bits. (The same interleaving as separate calls, tiles of 2-4 panels and 64-unit pieces of finish and
  // of the cell's passes between them, was slower than run_direction: the calls' own cost, and no overlap.)
  auto run_pair = [&]() {
    const qlin::QKernels& kq = qlin::qk();
    const i64 hlda = 4 * ((H + 3) / 4);
    const i64 panels = p.qr[0]->panels, ldr = panels * qlin::kPanel;
    float* xw_all = tl_buf(TL_MISC).get(static_cast<std::size_t>(std::max<i64>(1, 2 * seq * batch * GH)));
    struct Dir {
      i64 d = 0;
      bool backward = false;
      const qlin::QPacked* Rq = nullptr;
      const float* rs = nullptr;
      float* xw = nullptr;
      std::vector<float> h, c, col, bx;
      std::vector<std::int32_t> raw, hrow;
      std::vector<std::uint8_t> hq;
      std::int32_t h_zp = 0;
    };
    Dir dd[2];
    for (i64 d = 0; d < 2; ++d) {
      Dir& D = dd[d];
      D.d = d;
      D.backward = d == 1;
      D.Rq = p.qr[static_cast<std::size_t>(d)].get();
      D.rs = p.r_scale.data() + d * GH;
      D.xw = xw_all + d * seq * batch * GH;
      D.h.assign(static_cast<std::size_t>(batch * H), 0.f);
      D.c.assign(D.h.size(), 0.f);
      D.col.assign(static_cast<std::size_t>(GH), 0.f);
      D.bx.assign(static_cast<std::size_t>(GH), 0.f);
      D.raw.assign(static_cast<std::size_t>(batch * ldr), 0);
      D.hrow.assign(static_cast<std::size_t>(batch), 0);
      D.hq.assign(static_cast<std::size_t>(batch * hlda), 0);
      for (i64 j = 0; j < GH; ++j)
        D.bx[static_cast<std::size_t>(j)] = pB ? pB[d * 2 * GH + j] + pB[d * 2 * GH + GH + j] : 0.f;
      const float* ws = p.w_scale.data() + d * GH;
      for (i64 j = 0; j < GH; ++j) D.col[static_cast<std::size_t>(j)] = x_scale * ws[j];
      qlin::OutStage st;
      st.kind = qlin::OutStage::F32;
      st.out = D.xw;
      st.rs = GH;
      st.cs = 1;
      st.scale = D.col.data();
      st.fbias = D.bx.data();
      qlin::qgemm(*p.qw[static_cast<std::size_t>(d)], qlin::AOperand{xq.data(), xlda, &x_zp, 1}, seq * batch, st);
      if (ph0) std::memcpy(D.h.data(), ph0 + d * batch * H, static_cast<std::size_t>(batch * H) * sizeof(float));
      if (pc0) std::memcpy(D.c.data(), pc0 + d * batch * H, static_cast<std::size_t>(batch * H) * sizeof(float));
    }
    // H (this direction's last h) quantized for its next step's tile, col = its scale times R's column scales
    auto quantize_h = [&](Dir& D) {
      const float h_scale = quantize_rows_u8(D.h.data(), batch, H, H, D.hq.data(), hlda, &D.h_zp);
      kr.binary(B_MUL, BM_SV, &h_scale, D.rs, D.col.data(), GH);  // the table's vector pass: ~3 % of the layer in a loop
      kq.rowsums(D.hq.data(), batch, H, hlda, D.hrow.data());
    };
    // one direction's tile of a step (X) with the other's cells of step tg (Y), then Y's h quantized for its next
    auto phase = [&](Dir* X, Dir* Y, i64 tg) {
      LstmQPair a;
      if (X) {
        a.k4 = X->Rq->k4;
        a.panels = panels;
        a.pstride = X->Rq->pstride();
        a.hq = X->hq.data();
        a.b = X->Rq->data->p;
        a.raw_out = X->raw.data();
      }
      const i64 len = lens[0];
      if (Y && tg < len) {
        const i64 tx = Y->backward ? len - 1 - tg : tg;
        a.H = H;
        a.raw_in = Y->raw.data();
        a.colsum = Y->Rq->colsum.data();
        a.zb = Y->Rq->zb.data();
        a.za = Y->h_zp;
        a.rowsum = Y->hrow[0];
        a.K = Y->Rq->k;
        a.col = Y->col.data();
        a.xw = Y->xw + tx * GH;
        a.c = Y->c.data();
        a.h = Y->h.data();
        a.y = pY ? pY + (tx * 2 + Y->d) * H : nullptr;
      }
      kr.lstm_q_pair(a);
      if (Y && tg + 1 < seq) quantize_h(*Y);
    };
    quantize_h(dd[0]);
    quantize_h(dd[1]);
    for (i64 t = 0; t < seq; ++t) {
      phase(&dd[0], t > 0 ? &dd[1] : nullptr, t - 1);
      phase(&dd[1], &dd[0], t);
    }
    phase(nullptr, &dd[1], seq - 1);
    for (i64 d = 0; d < 2; ++d) {
      if (pYh) std::memcpy(pYh + d * batch * H, dd[d].h.data(), static_cast<std::size_t>(batch * H) * sizeof(float));
      if (pYc) std::memcpy(pYc + d * batch * H, dd[d].c.data(), static_cast<std::size_t>(batch * H) * sizeof(float));
    }
  };
  // The two directions of a bidirectional layer are independent: one a thread (the steps are a chain, so a direction
  // is the unit of parallel work; a direction that runs alone splits its quantized steps by hidden units instead).
  // A small layer (under kWakeFlops) takes the second thread only while the pool's worker is awake.
  const int T = num_threads();
  const double flops = 2.0 * static_cast<double>(seq * batch) * static_cast<double>(GH) * static_cast<double>(I + H);
  // run_pair: its kernel's tile is the avx512vnni one, its cells the default gates
  const bool pair = quant && dirs == 2 && T == 1 && seq > 0 && batch == 1 && H % 16 == 0 && kr.lstm_q_pair &&
                    &qlin::qk() == qlin::qkernels_avx512vnni() &&
                    !pP && !do_clip && !input_forget;
  if (dirs == 2 && T >= 2)
    parallel_for(2, 2, [&](i64 d) { run_direction(d, 1); }, 2 * flops >= kWakeFlops);
  else if (pair)
    run_pair();
  else
    for (i64 d = 0; d < dirs; ++d) run_direction(d, T);
}

void py_rnn_run(const RnnWeights& p, const py::array& X, const py::object& B, const py::object& lens_obj,
                const py::object& h0, const py::object& c0, const py::object& P, int direction, float clip,
                bool input_forget, bool linear_before_reset, const py::object& Y, const py::object& Yh,
                const py::object& Yc) {
  need_f32(X, "rnn_run", "X");
  need_contig(X, "rnn_run", "X");
  if (X.ndim() != 3 || X.shape(2) != p.I) fail("rnn_run: X must be (seq, batch, " + std::to_string(p.I) + ")");
  rnn_run_impl(p, cptr<float>(X), TokenRows{}, X.shape(0), X.shape(1), B, lens_obj, h0, c0, P, direction, clip,
               input_forget, linear_before_reset, Y, Yh, Yc);
}

// The layer on an embedding's token ids: proj from rnn_project, ids int64 / int32 (seq, batch) or (batch, seq) when
// batch_major; a negative id counts from the end of the table (Gather's rule), one outside it is an error.
void py_rnn_run_tokens(const RnnWeights& p, const py::array& proj, const py::array& ids, bool batch_major,
                       const py::object& B, const py::object& lens_obj, const py::object& h0, const py::object& c0,
                       const py::object& P, int direction, float clip, bool input_forget, bool linear_before_reset,
                       const py::object& Y, const py::object& Yh, const py::object& Yc) {
  const char* fn = "rnn_run_tokens";
  need_f32(proj, fn, "proj");
  need_contig(proj, fn, "proj");
  need_contig(ids, fn, "ids");
  if (!p.qw.empty()) fail("rnn_run_tokens: float weights only (rnn_prepack)");
  if (proj.ndim() != 3 || proj.shape(1) != p.dirs || proj.shape(2) != p.G * p.H)
    fail("rnn_run_tokens: proj must be (V, dirs, G*H) from rnn_project");
  const std::string ik = pyx::dkey(ids);
  if ((ik != "i8" && ik != "i4") || ids.ndim() != 2) fail("rnn_run_tokens: ids must be 2-D int64 or int32");
  const i64 seq = ids.shape(batch_major ? 1 : 0), batch = ids.shape(batch_major ? 0 : 1), V = proj.shape(0);
  // Gather's rule on a copy (the caller's ids stay as they are): negative counts from the end, outside is an error
  std::vector<std::int64_t> rows(static_cast<std::size_t>(seq * batch));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int64_t id = ik == "i8" ? static_cast<const std::int64_t*>(ids.data())[i]
                                       : static_cast<const std::int32_t*>(ids.data())[i];
    const std::int64_t v = id < 0 ? id + V : id;
    if (v < 0 || v >= V) fail("rnn_run_tokens: index " + std::to_string(id) + " outside [-V, V) for V " +
                              std::to_string(V));
    rows[i] = v;
  }
  rnn_run_impl(p, nullptr, TokenRows{cptr<float>(proj), rows.data(), batch_major}, seq, batch, B, lens_obj, h0, c0,
               P, direction, clip, input_forget, linear_before_reset, Y, Yh, Yc);
}

}  // namespace

void bind_rnn(py::module_& m) {
  py::class_<RnnWeights, std::shared_ptr<RnnWeights>>(m, "PackedRnn", "LSTM / GRU / RNN weights packed once.")
      .def_property_readonly("hidden_size", [](const RnnWeights& p) { return p.H; })
      .def_property_readonly("directions", [](const RnnWeights& p) { return p.dirs; });
  m.def("rnn_prepack", &py_rnn_prepack, py::arg("W"), py::arg("R"), py::arg("gru"), py::arg("bf16x3") = false,
        py::arg("simple") = std::string(),
        "simple: \"tanh\", \"relu\" or \"sigmoid\" for the plain RNN op (one gate, that activation); empty: LSTM / GRU.");
  m.def("rnn_prepack_q", &py_rnn_prepack_q, py::arg("W"), py::arg("R"), py::arg("w_zero_point"),
        py::arg("r_zero_point"), py::arg("w_scale"), py::arg("r_scale"));
  m.def("rnn_project", &py_rnn_project, py::arg("packed"), py::arg("table"));
  m.def("rnn_run_tokens", &py_rnn_run_tokens, py::arg("packed"), py::arg("proj"), py::arg("ids"),
        py::arg("batch_major"), py::arg("B"), py::arg("sequence_lens"), py::arg("initial_h"), py::arg("initial_c"),
        py::arg("P"), py::arg("direction"), py::arg("clip"), py::arg("input_forget"),
        py::arg("linear_before_reset"), py::arg("Y"), py::arg("Y_h"), py::arg("Y_c"));
  m.def("rnn_run", &py_rnn_run, py::arg("packed"), py::arg("X"), py::arg("B"), py::arg("sequence_lens"),
        py::arg("initial_h"), py::arg("initial_c"), py::arg("P"), py::arg("direction"), py::arg("clip"),
        py::arg("input_forget"), py::arg("linear_before_reset"), py::arg("Y"), py::arg("Y_h"), py::arg("Y_c"));
}

}  // namespace hetero
