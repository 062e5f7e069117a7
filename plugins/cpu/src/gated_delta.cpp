// Driver and bindings of the gated delta rule (hetero.ops.gated_delta.GatedDeltaRule): the gating runs here
// (O(T * Hv)); each value head's conv + SiLU + q/k normalisation, recurrence or chunked form and gated norm run on
// the ISA path chosen at run time (gated_delta_{avx512,avx2,generic}.cpp), heads in parallel.
#include "gated_delta.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"

namespace hetero {
namespace gd {

i64 head_scratch_floats(const Problem& p) {
  // Mirrors the buffer layout at the top of chunk() / recurrent() in gated_delta_impl.hpp (offsets padded to 16
  // floats, vectors of up to 16 lanes).
  auto pad = [](i64 n) { return (n + 15) / 16 * 16; };
  const i64 L = std::max<i64>(p.chunk, 1);
  const i64 chunked = 3 * pad(L * p.dk) + 2 * pad(L * p.dv) + 2 * pad(L * L) + 3 * pad(L + 16) + 2 * pad(L);
  const i64 recurrent = 3 * pad(p.dv) + 2 * pad(p.dk);
  return std::max(chunked, recurrent) + 16;
}

namespace {

using HeadFn = void (*)(const HeadArgs&);

HeadFn head_for(const char* isa, bool chunked) {
#if defined(HETERO_GD_X86)
  // The recurrence streams the state through 128-column rows: measured faster with 256-bit vectors.
  if (std::strcmp(isa, "avx512") == 0) return chunked ? head_avx512 : head_avx2;
  if (std::strcmp(isa, "avx2") == 0) return head_avx2;
#endif
  (void)isa;
  (void)chunked;
  return head_generic;
}

float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace

void run(const Problem& p, const char* isa, int threads) {
  const i64 T = p.T, K = p.kernel, hv = p.hv, C = 2 * p.hk * p.dk + p.hv * p.dv;
  if (T <= 0) return;
  thread_local std::vector<float> buf;
  const std::size_t need = static_cast<std::size_t>(2 * T * hv + K * C);
  if (buf.size() < need) buf.resize(need);
  float* g = buf.data();
  float* beta = g + T * hv;
  float* taps = beta + T * hv;  // [K, C]
  for (i64 c = 0; c < C; ++c)
    for (i64 j = 0; j < K; ++j) taps[j * C + c] = p.conv_w[c * K + j];
  for (i64 t = 0; t < T; ++t)
    for (i64 h = 0; h < hv; ++h) {
      const float a = p.a[t * hv + h], b = p.b[t * hv + h];
      if (p.a_log) {
        g[t * hv + h] = -std::exp(p.a_log[h]) * softplus(a + p.dt_bias[h]);
        beta[t * hv + h] = 1.f / (1.f + std::exp(-b));
      } else {
        g[t * hv + h] = a;
        beta[t * hv + h] = b;
      }
    }
  const HeadFn fn = head_for(isa, p.chunk > 0);
  const i64 scratch = head_scratch_floats(p);
  parallel_for(hv, threads, [&](i64 head) {
    thread_local AlignedBuf s;
    HeadArgs args{&p, taps, g, beta, head, s.get(static_cast<std::size_t>(scratch))};
    fn(args);
  });
}

}  // namespace gd
}  // namespace hetero

namespace py = pybind11;

namespace {

using hetero::gd::i64;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument("gated_delta: " + msg); }

const float* f32_in(const py::object& obj, i64 n, const char* name, bool optional) {
  if (obj.is_none()) {
    if (!optional) fail(std::string(name) + " is required");
    return nullptr;
  }
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array_t<float>>(obj) || !(a.flags() & py::array::c_style))
    fail(std::string(name) + " must be a C-contiguous float32 array");
  if (a.size() != n)
    fail(std::string(name) + " has " + std::to_string(a.size()) + " elements, expected " + std::to_string(n));
  return static_cast<const float*>(a.data());
}

float* f32_out(const py::object& obj, i64 n, const char* name, bool optional) {
  const float* p = f32_in(obj, n, name, optional);
  if (p && !py::reinterpret_borrow<py::array>(obj).writeable()) fail(std::string(name) + " must be writable");
  return const_cast<float*>(p);
}

void py_gated_delta(const py::object& window, const py::object& conv_w, const py::object& conv_b,
                    const py::object& a, const py::object& b, const py::object& a_log, const py::object& dt_bias,
                    const py::object& z, const py::object& norm_w, const py::object& state, const py::object& out,
                    i64 hk, i64 hv, i64 dk, i64 dv, i64 chunk, i64 first, float scale, bool l2norm, bool conv_silu,
                    float l2_eps, float norm_eps) {
  if (hk < 1 || hv < 1 || dk < 1 || dv < 1 || hv % hk) fail("bad head counts / sizes");
  if (chunk < 0 || chunk > 1024) fail("chunk must be in [0, 1024]");
  const i64 C = 2 * hk * dk + hv * dv;
  auto wa = py::reinterpret_borrow<py::array>(conv_w);
  if (wa.ndim() != 2 || wa.shape(0) != C) fail("conv_w must be [C, K]");
  const i64 K = wa.shape(1);
  auto win = py::reinterpret_borrow<py::array>(window);
  if (win.ndim() != 2 || win.shape(1) != C || win.shape(0) < K - 1) fail("window must be [T + K - 1, C]");
  const i64 T = win.shape(0) - (K - 1);
  hetero::gd::Problem p{};
  p.T = T;
  p.hk = hk;
  p.hv = hv;
  p.dk = dk;
  p.dv = dv;
  p.kernel = K;
  p.window = f32_in(window, (T + K - 1) * C, "window", false);
  p.conv_w = f32_in(conv_w, C * K, "conv_w", false);
  p.conv_b = f32_in(conv_b, C, "conv_b", true);
  p.a = f32_in(a, T * hv, "a", false);
  p.b = f32_in(b, T * hv, "b", false);
  p.a_log = f32_in(a_log, hv, "a_log", true);
  p.dt_bias = f32_in(dt_bias, hv, "dt_bias", p.a_log == nullptr);
  p.z = f32_in(z, T * hv * dv, "z", true);
  p.norm_w = f32_in(norm_w, dv, "norm_w", p.z == nullptr);
  p.state = f32_out(state, hv * dk * dv, "state", false);
  p.out = f32_out(out, T * hv * dv, "out", true);
  p.chunk = chunk;
  p.first = first;
  p.scale = scale;
  p.l2norm = l2norm;
  p.conv_silu = conv_silu;
  p.l2_eps = l2_eps;
  p.norm_eps = norm_eps;
  const std::string isa = hetero::active().name;
  const int threads = hetero::num_threads();
  py::gil_scoped_release nogil;
  hetero::gd::run(p, isa.c_str(), threads);
}

}  // namespace

void bind_gated_delta(pybind11::module_& m) {
  m.def("gated_delta", &py_gated_delta, py::arg("window"), py::arg("conv_w"), py::arg("conv_b"), py::arg("a"),
        py::arg("b"), py::arg("a_log"), py::arg("dt_bias"), py::arg("z"), py::arg("norm_w"), py::arg("state"),
        py::arg("out"), py::arg("hk"), py::arg("hv"), py::arg("dk"), py::arg("dv"), py::arg("chunk"),
        py::arg("first"), py::arg("scale"), py::arg("l2norm") = true, py::arg("conv_silu") = true,
        py::arg("l2_eps") = 1e-6f, py::arg("norm_eps") = 1e-6f,
        "Gated DeltaNet over T positions (see hetero.ops.gated_delta): conv over window [T + K - 1, C], gating, "
        "the recurrence (chunk=0) or the chunked form (first chunk of `first` positions), gated norm; updates "
        "state [hv, dk, dv] in place, writes out [T, hv * dv] unless None.");
}
