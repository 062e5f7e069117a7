// float16 <-> float32 conversion: the scalar rule (numpy's astype, bit for bit), the per-ISA dispatch and the
// bindings (half_to_float / float_to_half). The SIMD bodies sit in half_avx2.cpp (F16C) and half_avx512.cpp.
#include "half.hpp"

#include <algorithm>
#include <cstring>

#include "onnx_py.hpp"

#if defined(HETERO_HALF_X86)
#include <cpuid.h>
#endif

namespace hetero {
namespace half {

std::uint16_t to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf, or NaN: the payload's top ten bits, kept non-zero
    if (ax == 0x7f800000u) return sign | 0x7c00u;
    const std::uint32_t r = 0x7c00u + ((ax & 0x7fffffu) >> 13);
    return static_cast<std::uint16_t>(sign | (r == 0x7c00u ? 0x7c01u : r));
  }
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // from 65520 (half way past 65504, a tie to odd): Inf
  if (ax >= 0x38800000u) {                       // a normal half: rebias, round the 13 dropped bits to even
    std::uint32_t r = (ax - 0x38000000u) >> 13;
    const std::uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry into the exponent is the right value
    return static_cast<std::uint16_t>(sign | r);
  }
  if (ax <= 0x33000000u) return sign;  // at most 2^-25 (the tie rounds to the even 0): a signed zero
  // A subnormal half: the 24-bit significand in units of 2^-24, rounded to even (0x400 is the smallest normal).
  const std::uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;  // shift in [14, 24]
  std::uint32_t r = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

float to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = h & 0x7c00u;
  std::uint32_t m = h & 0x3ffu, x;
  if (e == 0x7c00u) {
    x = sign | 0x7f800000u | (m << 13);  // Inf, or NaN with its payload (a signalling one stays signalling)
  } else if (e != 0) {
    x = sign | ((static_cast<std::uint32_t>(h & 0x7fffu) << 13) + 0x38000000u);
  } else if (m == 0) {
    x = sign;
  } else {  // subnormal: m * 2^-24, normalised
    std::uint32_t e32 = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      --e32;
    }
    x = sign | (e32 << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

void to_float_generic(const std::uint16_t* src, float* dst, i64 n) {
  for (i64 i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

void to_half_generic(const float* src, std::uint16_t* dst, i64 n) {
  for (i64 i = 0; i < n; ++i) dst[i] = to_half(src[i]);
}

#if !defined(HETERO_HALF_X86)
void to_float_f16c(const std::uint16_t* s, float* d, i64 n) { to_float_generic(s, d, n); }
void to_half_f16c(const float* s, std::uint16_t* d, i64 n) { to_half_generic(s, d, n); }
void to_float_avx512(const std::uint16_t* s, float* d, i64 n) { to_float_generic(s, d, n); }
void to_half_avx512(const float* s, std::uint16_t* d, i64 n) { to_half_generic(s, d, n); }
#endif

namespace {

bool cpu_has_f16c() {
#if defined(HETERO_HALF_X86)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#else
  return false;
#endif
}

// The active ISA's pair (set_isa switches it, so asked per call; an avx2 table on a CPU without F16C: generic).
const char* path_name() {
  const char* isa = active().name;
  if (std::strcmp(isa, "avx512") == 0) return "avx512";
  static const bool f16c = cpu_has_f16c();
  if (std::strcmp(isa, "avx2") == 0 && f16c) return "f16c";
  return "generic";
}

template <class S, class D>
void run_chunked(void (*fn)(const S*, D*, i64), const S* src, D* dst, i64 n) {
  // Memory-bound: a thread per 256K values at least (about what waking a pool worker costs).
  constexpr i64 kChunk = 1 << 15;
  const int threads = threads_for(static_cast<double>(n), 2.5e5);
  if (threads <= 1) {
    fn(src, dst, n);
    return;
  }
  parallel_for(ceil_div(n, kChunk), threads, [&](i64 t) {
    const i64 b = t * kChunk;
    fn(src + b, dst + b, std::min(kChunk, n - b));
  });
}

namespace py = pybind11;

const char* dtype_name(const char* key) { return key[1] == '2' ? "float16" : "float32"; }

void check_pair(const py::array& src, const py::array& out, const char* fn, const char* sk, const char* ok) {
  if (pyx::dkey(src) != sk) pyx::fail(std::string(fn) + ": src must be " + dtype_name(sk));
  if (pyx::dkey(out) != ok) pyx::fail(std::string(fn) + ": out must be " + dtype_name(ok));
  pyx::need_contig(src, fn, "src");
  pyx::need_out(out, fn);
  if (src.size() != out.size()) pyx::fail(std::string(fn) + ": src and out sizes differ");
}

void py_half_to_float(const py::array& src, const py::array& out) {
  check_pair(src, out, "half_to_float", "f2", "f4");
  const auto* s = static_cast<const std::uint16_t*>(src.data());
  auto* d = static_cast<float*>(const_cast<void*>(out.data()));
  const i64 n = static_cast<i64>(src.size());
  const char* p = path_name();
  const ToFloatFn fn = p[0] == 'a' ? to_float_avx512 : p[0] == 'f' ? to_float_f16c : to_float_generic;
  py::gil_scoped_release nogil;
  run_chunked(fn, s, d, n);
}

void py_float_to_half(const py::array& src, const py::array& out) {
  check_pair(src, out, "float_to_half", "f4", "f2");
  const auto* s = static_cast<const float*>(src.data());
  auto* d = static_cast<std::uint16_t*>(const_cast<void*>(out.data()));
  const i64 n = static_cast<i64>(src.size());
  const char* p = path_name();
  const ToHalfFn fn = p[0] == 'a' ? to_half_avx512 : p[0] == 'f' ? to_half_f16c : to_half_generic;
  py::gil_scoped_release nogil;
  run_chunked(fn, s, d, n);
}

}  // namespace

}  // namespace half

void bind_half(pybind11::module_& m) {
  m.def("half_to_float", &half::py_half_to_float, pybind11::arg("src"), pybind11::arg("out"),
        "out[:] = src (float16, C-contiguous) as float32; numpy's astype bit for bit.");
  m.def("float_to_half", &half::py_float_to_half, pybind11::arg("src"), pybind11::arg("out"),
        "out[:] = src (float32, C-contiguous) as float16, rounded to nearest even; numpy's astype bit for bit.");
  m.def("half_path", [] { return std::string(half::path_name()); },
        "The float16 conversion path in use: avx512, f16c or generic (follows set_isa).");
}

}  // namespace hetero
