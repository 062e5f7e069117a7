// Small pybind11 helpers shared by the extra ONNX bindings (onnx_extra.cpp, conv_transpose.cpp, rnn.cpp).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common.hpp"

namespace hetero {
namespace pyx {

namespace py = pybind11;

[[noreturn]] inline void fail(const std::string& msg) { throw std::invalid_argument(msg); }

inline std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// dtype kind + itemsize, native byte order only ('f4', 'i8', 'u1', 'b1', ...).
inline std::string dkey(const py::array& a) {
  const py::dtype d = a.dtype();
  if (d.byteorder() == '>') fail("non-native byte order is not supported");
  return std::string(1, d.kind()) + std::to_string(d.itemsize());
}
inline bool is_f32(const py::array& a) { return dkey(a) == "f4"; }
inline void need_f32(const py::array& a, const char* fn, const char* name) {
  if (!is_f32(a)) fail(std::string(fn) + ": " + name + " must be float32, got " + std::string(py::str(a.dtype())));
}
inline bool c_contig(const py::array& a) { return (a.flags() & py::array::c_style) != 0; }
inline void need_contig(const py::array& a, const char* fn, const char* name) {
  if (!c_contig(a)) fail(std::string(fn) + ": " + name + " must be C-contiguous");
}
inline void need_out(const py::array& a, const char* fn, const char* name = "out") {
  need_contig(a, fn, name);
  if (!a.writeable()) fail(std::string(fn) + ": " + name + " must be writable");
}
inline std::vector<i64> shape_of(const py::array& a) {
  std::vector<i64> s(static_cast<std::size_t>(a.ndim()));
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s[static_cast<std::size_t>(d)] = a.shape(d);
  return s;
}
inline std::vector<i64> strides_of(const py::array& a) {
  std::vector<i64> s(static_cast<std::size_t>(a.ndim()));
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s[static_cast<std::size_t>(d)] = a.strides(d);
  return s;
}
inline void need_shape(const py::array& a, const std::vector<i64>& want, const char* fn, const char* name) {
  if (shape_of(a) != want) {
    std::string w = "(";
    for (std::size_t d = 0; d < want.size(); ++d) w += (d ? ", " : "") + std::to_string(want[d]);
    fail(std::string(fn) + ": " + name + " has shape " + shape_str(a) + ", expected " + w + (want.size() == 1 ? ",)" : ")"));
  }
}
template <class T>
const T* cptr(const py::array& a) {
  return static_cast<const T*>(a.data());
}
template <class T>
T* mptr(const py::array& a) {
  return static_cast<T*>(const_cast<void*>(a.data()));
}

}  // namespace pyx
}  // namespace hetero
