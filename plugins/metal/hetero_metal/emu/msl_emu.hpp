// The Metal Shading Language as C++17, for the emulator: address spaces, scalar and vector types (half is a real
// IEEE binary16 with round-to-nearest-even), the math and integer functions the kernels use, built-in kernel
// arguments, barriers, the simdgroup functions and simdgroup_matrix. A .metal source of this plugin compiles against
// this header unchanged; kernels declare threadgroup memory with TG_ARRAY (common.metal), which here is a checked
// array whose every access goes through the race checker of fibers.cpp.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cfloat>
#include <type_traits>

#include "fibers.hpp"

// -- scalar types --------------------------------------------------------------------------------------------------
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;

namespace emu {
inline uint16_t float_to_half_bits(float value) {
    uint32_t f;
    memcpy(&f, &value, 4);
    const uint32_t sign = (f >> 16) & 0x8000u;
    const uint32_t abs = f & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) return uint16_t(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));  // inf, NaN
    if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to infinity (>= 65520)
    if (abs < 0x38800000u) {  // subnormal half (or zero): scale to an integer number of 2^-24 units, round to even
        if (abs < 0x33000000u) return uint16_t(sign);  // below half the smallest subnormal
        const uint32_t shift = 126 - (abs >> 23);  // 14..24: value / 2^-24 = mantissa >> shift
        const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
        uint32_t q = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (q & 1u))) ++q;
        return uint16_t(sign | q);
    }
    uint32_t h = ((abs >> 13) - (112u << 10));  // rebias the exponent
    const uint32_t rest = abs & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // the carry may step into the exponent: correct
    return uint16_t(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, f;
    if (exponent == 0x1F) {
        f = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        f = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        f = sign;
    } else {  // subnormal: normalise
        exponent = 113;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            --exponent;
        }
        f = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
    }
    float out;
    memcpy(&out, &f, 4);
    return out;
}
}  // namespace emu

// half: 16-bit storage; arithmetic between halves rounds each result to half (a float operation on two halves
// rounded once to half is the correctly rounded half operation), mixed half/float arithmetic is float, as in MSL.
struct half {
    uint16_t bits;
    half() = default;
    half(float value) : bits(emu::float_to_half_bits(value)) {}
    operator float() const { return emu::half_bits_to_float(bits); }
    half& operator+=(half o) { return *this = half(float(*this) + float(o)); }
    half& operator-=(half o) { return *this = half(float(*this) - float(o)); }
    half& operator*=(half o) { return *this = half(float(*this) * float(o)); }
    half& operator/=(half o) { return *this = half(float(*this) / float(o)); }
};
inline half operator+(half a, half b) { return half(float(a) + float(b)); }
inline half operator-(half a, half b) { return half(float(a) - float(b)); }
inline half operator*(half a, half b) { return half(float(a) * float(b)); }
inline half operator/(half a, half b) { return half(float(a) / float(b)); }
inline half operator-(half a) { half r = a; r.bits ^= 0x8000u; return r; }
#define EMU_MIXED(op)                                                        \
    inline float operator op(half a, float b) { return float(a) op b; } \
    inline float operator op(float a, half b) { return a op float(b); }
EMU_MIXED(+)
EMU_MIXED(-)
EMU_MIXED(*)
EMU_MIXED(/)
#undef EMU_MIXED

// -- vectors -------------------------------------------------------------------------------------------------------
namespace emu {
template <class T, int N>
struct vec_storage;
template <class T>
struct vec_storage<T, 2> { T x, y; };
template <class T>
struct vec_storage<T, 3> { T x, y, z; };
template <class T>
struct vec_storage<T, 4> { T x, y, z, w; };

template <class T, int N>
struct vec : vec_storage<T, N> {
    vec() = default;
    vec(T s) { for (int i = 0; i < N; ++i) (*this)[i] = s; }
    template <int M = N, class = std::enable_if_t<M == 2>>
    vec(T a, T b) { this->x = a; this->y = b; }
    template <int M = N, class = std::enable_if_t<M == 3>>
    vec(T a, T b, T c) { this->x = a; this->y = b; this->z = c; }
    template <int M = N, class = std::enable_if_t<M == 4>>
    vec(T a, T b, T c, T d) { this->x = a; this->y = b; this->z = c; this->w = d; }
    template <class U>
    explicit vec(const vec<U, N>& o) { for (int i = 0; i < N; ++i) (*this)[i] = T(o[i]); }
    T& operator[](int i) { return (&this->x)[i]; }
    const T& operator[](int i) const { return (&this->x)[i]; }
};

#define EMU_VEC_OP(op)                                                                                   \
    template <class T, int N>                                                                           \
    vec<T, N> operator op(const vec<T, N>& a, const vec<T, N>& b) {                                     \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = a[i] op b[i]; return r;                         \
    }                                                                                                   \
    template <class T, int N>                                                                           \
    vec<T, N> operator op(const vec<T, N>& a, std::common_type_t<T> s) { return a op vec<T, N>(s); }   \
    template <class T, int N>                                                                           \
    vec<T, N> operator op(std::common_type_t<T> s, const vec<T, N>& a) { return vec<T, N>(s) op a; }   \
    template <class T, int N>                                                                           \
    vec<T, N>& operator op##=(vec<T, N>& a, const vec<T, N>& b) { return a = a op b; }
EMU_VEC_OP(+)
EMU_VEC_OP(-)
EMU_VEC_OP(*)
EMU_VEC_OP(/)
#undef EMU_VEC_OP
template <class T, int N>
vec<T, N> operator-(const vec<T, N>& a) { vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = -a[i]; return r; }

template <class T, int N>
T dot_of(const vec<T, N>& a, const vec<T, N>& b) {
    T sum = a[0] * b[0];
    for (int i = 1; i < N; ++i) sum = sum + a[i] * b[i];
    return sum;
}
}  // namespace emu

#define EMU_VECTOR_TYPES(T)             \
    typedef emu::vec<T, 2> T##2;        \
    typedef emu::vec<T, 3> T##3;        \
    typedef emu::vec<T, 4> T##4;
EMU_VECTOR_TYPES(float)
EMU_VECTOR_TYPES(half)
EMU_VECTOR_TYPES(int)
EMU_VECTOR_TYPES(uint)
EMU_VECTOR_TYPES(ushort)
EMU_VECTOR_TYPES(uchar)
EMU_VECTOR_TYPES(ulong)
#undef EMU_VECTOR_TYPES

template <class T, int N>
T dot(const emu::vec<T, N>& a, const emu::vec<T, N>& b) { return emu::dot_of(a, b); }

// -- math -----------------------------------------------------------------------------------------------------------
// <math.h> gives the float overloads of exp, log, sqrt, tanh...; half and vector overloads, and MSL's own functions.
#define EMU_HALF_UNARY(name) inline half name(half x) { return half(name(float(x))); }
EMU_HALF_UNARY(exp)
EMU_HALF_UNARY(exp2)
EMU_HALF_UNARY(log)
EMU_HALF_UNARY(sqrt)
EMU_HALF_UNARY(tanh)
EMU_HALF_UNARY(fabs)
#undef EMU_HALF_UNARY
inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
inline half rsqrt(half x) { return half(rsqrt(float(x))); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline float min(float a, float b) { return fminf(a, b); }
inline half max(half a, half b) { return half(fmaxf(a, b)); }
inline half min(half a, half b) { return half(fminf(a, b)); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline uint max(uint a, uint b) { return a > b ? a : b; }
inline uint min(uint a, uint b) { return a < b ? a : b; }
inline float clamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
inline int clamp(int x, int lo, int hi) { return min(max(x, lo), hi); }
inline float fast_divide(float a, float b) { return a / b; }
inline float precise_divide(float a, float b) { return a / b; }
template <class T, int N>
emu::vec<T, N> max(const emu::vec<T, N>& a, const emu::vec<T, N>& b) {
    emu::vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = max(a[i], b[i]); return r;
}
template <class T, int N>
emu::vec<T, N> exp(const emu::vec<T, N>& a) { emu::vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = exp(a[i]); return r; }
template <class T, class U>
T select(T a, T b, U c) { return c ? b : a; }

template <class To, class From>
To as_type(const From& from) {
    static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
    To to;
    memcpy(&to, &from, sizeof(To));
    return to;
}

// -- address spaces and kernel attributes --------------------------------------------------------------------------
// `constant` data is read-only; `device` and `thread` are plain memory. `threadgroup` is left undefined: kernels
// declare it through TG_ARRAY / TG_PTR, which the emulator checks.
#define device
#define constant const
#define thread
#define kernel

// -- threadgroup memory -------------------------------------------------------------------------------------------
namespace emu {
template <class T>
class TgRef {
  public:
    explicit TgRef(T* p) : p_(p) {}
    operator T() const { threadgroup_read(p_, sizeof(T)); return *p_; }
    template <class U = T, class = std::enable_if_t<std::is_same<U, half>::value>>
    operator float() const { threadgroup_read(p_, sizeof(T)); return float(*p_); }
    TgRef& operator=(const T& v) { threadgroup_write(p_, sizeof(T)); *p_ = v; return *this; }
    TgRef& operator=(const TgRef& o) { return *this = T(o); }
    TgRef& operator+=(const T& v) { return *this = T(T(*this) + v); }
    TgRef& operator-=(const T& v) { return *this = T(T(*this) - v); }
    TgRef& operator*=(const T& v) { return *this = T(T(*this) * v); }
    T* address() const { return p_; }

  private:
    T* p_;
};

// A pointer into threadgroup memory that knows the array it points into: indexing past it is reported.
template <class T>
class TgPtr {
  public:
    TgPtr() = default;
    TgPtr(T* base, long offset, std::size_t count) : base_(base), offset_(offset), count_(count) {}
    TgRef<T> operator[](long i) const { return TgRef<T>(at(i)); }
    TgRef<T> operator*() const { return (*this)[0]; }
    TgPtr operator+(long d) const { return TgPtr(base_, offset_ + d, count_); }
    TgPtr operator-(long d) const { return TgPtr(base_, offset_ - d, count_); }
    // untracked access, for the lanes' shares of simdgroup_matrix transfers (each lane tracks its own share)
    T* at(long i) const {
        const long k = offset_ + i;
        if (k < 0 || std::size_t(k) >= count_)
            return static_cast<T*>(report_out_of_bounds("a threadgroup array", k, count_));
        return base_ + k;
    }

  private:
    T* base_ = nullptr;
    long offset_ = 0;
    std::size_t count_ = 0;
};

template <class T>
TgPtr<T> threadgroup_array(std::size_t count) {
    std::size_t capacity = 0;
    T* base = static_cast<T*>(threadgroup_alloc(count * sizeof(T), alignof(T) < 16 ? 16 : alignof(T), &capacity));
    return TgPtr<T>(base, 0, capacity / sizeof(T));
}
}  // namespace emu

// -- barriers ------------------------------------------------------------------------------------------------------
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }
inline void threadgroup_barrier(mem_flags) { emu::threadgroup_barrier_wait(); }
inline void simdgroup_barrier(mem_flags) { emu::simdgroup_barrier_wait(); }

// -- built-in kernel arguments -------------------------------------------------------------------------------------
namespace emu {
template <class T>
struct BuiltinValue;
template <> struct BuiltinValue<uint> { static uint get(const uint32_t* v) { return v[0]; } };
template <> struct BuiltinValue<ushort> { static ushort get(const uint32_t* v) { return ushort(v[0]); } };
template <> struct BuiltinValue<uint2> { static uint2 get(const uint32_t* v) { return uint2(v[0], v[1]); } };
template <> struct BuiltinValue<uint3> { static uint3 get(const uint32_t* v) { return uint3(v[0], v[1], v[2]); } };
template <> struct BuiltinValue<ushort2> {
    static ushort2 get(const uint32_t* v) { return ushort2(ushort(v[0]), ushort(v[1])); }
};
template <> struct BuiltinValue<ushort3> {
    static ushort3 get(const uint32_t* v) { return ushort3(ushort(v[0]), ushort(v[1]), ushort(v[2])); }
};

template <class T>
T builtin(const Invocation& inv, Builtin which) { return BuiltinValue<std::decay_t<T>>::get(inv.builtins[which]); }

// A buffer argument as the kernel declares it: a pointer, or a reference to a constant struct.
template <class T>
T argument(const Invocation& inv, int index) {
    if constexpr (std::is_pointer<T>::value) {
        return reinterpret_cast<T>(inv.buffers[index]);
    } else {
        return *reinterpret_cast<std::remove_reference_t<T>*>(inv.buffers[index]);
    }
}
}  // namespace emu

#include "simd.hpp"
