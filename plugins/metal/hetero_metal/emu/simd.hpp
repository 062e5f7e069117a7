// MSL's simdgroup functions for the emulator: every one is a collective (fibers.hpp) — a lane waits until every
// live lane of its simdgroup has called it, then one combine step computes every lane's result, so lanes meet in
// lockstep as on the GPU. Lanes that have returned are inactive: they contribute nothing, and reading one (a shuffle
// from it) gives NaN / all-ones, so a kernel that depends on it shows wrong results.
#pragma once

namespace emu {

template <class T>
T poison() {
    T value;
    memset(static_cast<void*>(&value), 0xFF, sizeof value);
    return value;
}

template <class T>
const T& in_of(const LaneCall& lane) { return *static_cast<const T*>(lane.in); }
template <class T>
T& out_of(LaneCall& lane) { return *static_cast<T*>(lane.out); }

template <class T>
T reduce_max(T a, T b) { return max(a, b); }
template <class T>
T reduce_min(T a, T b) { return min(a, b); }
template <class T>
T reduce_sum(T a, T b) { return a + b; }

// A reduction over the active lanes, as a butterfly tree over lane numbers (the order a hardware reduction takes),
// its result given to every active lane.
template <class T, T (*op)(T, T)>
const char* combine_reduce(LaneCall* lanes, int width) {
    T values[kSimdWidth];
    bool have[kSimdWidth];
    for (int i = 0; i < width; ++i) {
        have[i] = lanes[i].active;
        if (have[i]) values[i] = in_of<T>(lanes[i]);
    }
    for (int step = 1; step < width; step *= 2)
        for (int i = 0; i + step < width; i += 2 * step) {
            if (have[i] && have[i + step]) values[i] = op(values[i], values[i + step]);
            else if (have[i + step]) values[i] = values[i + step];
            have[i] = have[i] || have[i + step];
        }
    for (int i = 0; i < width; ++i)
        if (lanes[i].active) out_of<T>(lanes[i]) = values[0];
    return nullptr;
}

template <class T, bool inclusive>
const char* combine_prefix_sum(LaneCall* lanes, int width) {
    T running = T(0);
    for (int i = 0; i < width; ++i) {
        if (!lanes[i].active) continue;
        const T value = in_of<T>(lanes[i]);
        out_of<T>(lanes[i]) = inclusive ? T(running + value) : running;
        running = running + value;
    }
    return nullptr;
}

enum class Shuffle { index, down, up, xor_mask, broadcast };

template <class T, Shuffle kind>
const char* combine_shuffle(LaneCall* lanes, int width) {
    T results[kSimdWidth];
    int first_active = -1;
    for (int i = 0; i < width; ++i) {
        if (!lanes[i].active) continue;
        if (first_active < 0) first_active = i;
        const uint32_t arg = lanes[i].arg;
        if (kind == Shuffle::broadcast && arg != lanes[first_active].arg)
            return "simd_broadcast with a lane that differs between lanes (it must be uniform)";
        long source = i;
        switch (kind) {
            case Shuffle::index: case Shuffle::broadcast: source = long(arg); break;
            case Shuffle::down: source = long(i) + arg < width ? long(i) + arg : i; break;  // upper lanes keep theirs
            case Shuffle::up: source = long(i) - long(arg) >= 0 ? long(i) - long(arg) : i; break;
            case Shuffle::xor_mask: source = long(i ^ int(arg)); break;
        }
        results[i] = source >= 0 && source < width && lanes[source].active ? in_of<T>(lanes[source]) : poison<T>();
    }
    for (int i = 0; i < width; ++i)
        if (lanes[i].active) out_of<T>(lanes[i]) = results[i];
    return nullptr;
}

template <class T>
const char* combine_first(LaneCall* lanes, int width) {
    int first = 0;
    while (first < width && !lanes[first].active) ++first;
    for (int i = 0; i < width; ++i)
        if (lanes[i].active) out_of<T>(lanes[i]) = in_of<T>(lanes[first]);
    return nullptr;
}

template <class T>
T run_collective(Combine combine, const T& x, uint32_t arg = 0) {
    T out;
    collective(combine, &x, &out, arg);
    return out;
}

// Checks that every active lane passes the same bytes (the arguments of a simdgroup_matrix operation, which must be
// uniform across the simdgroup).
template <class Payload>
const char* combine_uniform(LaneCall* lanes, int width) {
    const void* first = nullptr;
    for (int i = 0; i < width; ++i) {
        if (!lanes[i].active) continue;
        if (first == nullptr) first = lanes[i].in;
        else if (memcmp(first, lanes[i].in, sizeof(Payload)) != 0)
            return "a simdgroup_matrix operation with arguments (or matrices) that differ between lanes";
    }
    return nullptr;
}
}  // namespace emu

template <class T> T simd_sum(T x) { return emu::run_collective(&emu::combine_reduce<T, emu::reduce_sum<T>>, x); }
template <class T> T simd_max(T x) { return emu::run_collective(&emu::combine_reduce<T, emu::reduce_max<T>>, x); }
template <class T> T simd_min(T x) { return emu::run_collective(&emu::combine_reduce<T, emu::reduce_min<T>>, x); }
template <class T> T simd_prefix_exclusive_sum(T x) { return emu::run_collective(&emu::combine_prefix_sum<T, false>, x); }
template <class T> T simd_prefix_inclusive_sum(T x) { return emu::run_collective(&emu::combine_prefix_sum<T, true>, x); }
template <class T> T simd_shuffle(T x, ushort lane) {
    return emu::run_collective(&emu::combine_shuffle<T, emu::Shuffle::index>, x, lane);
}
template <class T> T simd_shuffle_down(T x, ushort delta) {
    return emu::run_collective(&emu::combine_shuffle<T, emu::Shuffle::down>, x, delta);
}
template <class T> T simd_shuffle_up(T x, ushort delta) {
    return emu::run_collective(&emu::combine_shuffle<T, emu::Shuffle::up>, x, delta);
}
template <class T> T simd_shuffle_xor(T x, ushort mask) {
    return emu::run_collective(&emu::combine_shuffle<T, emu::Shuffle::xor_mask>, x, mask);
}
template <class T> T simd_broadcast(T x, ushort lane) {
    return emu::run_collective(&emu::combine_shuffle<T, emu::Shuffle::broadcast>, x, lane);
}
template <class T> T simd_broadcast_first(T x) { return emu::run_collective(&emu::combine_first<T>, x); }

// -- simdgroup_matrix ---------------------------------------------------------------------------------------------
// Every lane holds the whole 8x8 matrix (the hardware spreads it over the lanes, two elements each); operations are
// collectives that check the lanes agree. Transfers to and from threadgroup memory are tracked per lane share:
// lane l reads / writes elements 2l and 2l + 1 (row-major), as the hardware distributes them.
template <class T, int Rows, int Cols>
struct simdgroup_matrix {
    static_assert(Rows == 8 && Cols == 8, "the emulator implements 8x8 simdgroup matrices");
    T e[Rows][Cols];
    simdgroup_matrix() { for (auto& row : e) for (auto& v : row) v = T(0); }
    explicit simdgroup_matrix(T diagonal) : simdgroup_matrix() { for (int i = 0; i < Rows; ++i) e[i][i] = diagonal; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int R, int C>
simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T value) {
    simdgroup_matrix<T, R, C> m;
    for (auto& row : m.e) for (auto& v : row) v = value;
    return m;
}

namespace emu {
struct TransferArgs {
    const void* base;
    long offset;
    ulong stride;
    bool transpose;
};
inline void agree_on_transfer(const void* base, long offset, ulong stride, bool transpose) {
    TransferArgs args;
    memset(&args, 0, sizeof args);
    args.base = base;
    args.offset = offset;
    args.stride = stride;
    args.transpose = transpose;
    char unused;
    collective(&combine_uniform<TransferArgs>, &args, &unused, 0);
}
inline bool lane_owns(int r, int c) { return uint32_t(r * 8 + c) / 2 == current_lane(); }
}  // namespace emu

template <class T, class U>
void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, const U* src, ulong elements_per_row = 8, ulong2 origin = ulong2(0, 0),
                    bool transpose = false) {
    emu::agree_on_transfer(src, long(origin.y * elements_per_row + origin.x), elements_per_row, transpose);
    src += origin.y * elements_per_row + origin.x;
    for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c) m.e[r][c] = T(transpose ? src[c * elements_per_row + r] : src[r * elements_per_row + c]);
}

template <class T, class U>
void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, emu::TgPtr<U> src, ulong elements_per_row = 8,
                    ulong2 origin = ulong2(0, 0), bool transpose = false) {
    emu::agree_on_transfer(src.at(0), long(origin.y * elements_per_row + origin.x), elements_per_row, transpose);
    src = src + long(origin.y * elements_per_row + origin.x);
    for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c) {
            const long i = long(transpose ? c * elements_per_row + r : r * elements_per_row + c);
            m.e[r][c] = T(emu::lane_owns(r, c) ? U(src[i]) : *src.at(i));
        }
}

template <class T, class U>
void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, U* dst, ulong elements_per_row = 8,
                     ulong2 origin = ulong2(0, 0), bool transpose = false) {
    emu::agree_on_transfer(dst, long(origin.y * elements_per_row + origin.x), elements_per_row, transpose);
    dst += origin.y * elements_per_row + origin.x;
    for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c)
            if (emu::lane_owns(r, c)) (transpose ? dst[c * elements_per_row + r] : dst[r * elements_per_row + c]) = U(m.e[r][c]);
}

template <class T, class U>
void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, emu::TgPtr<U> dst, ulong elements_per_row = 8,
                     ulong2 origin = ulong2(0, 0), bool transpose = false) {
    emu::agree_on_transfer(dst.at(0), long(origin.y * elements_per_row + origin.x), elements_per_row, transpose);
    dst = dst + long(origin.y * elements_per_row + origin.x);
    for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c)
            if (emu::lane_owns(r, c)) dst[long(transpose ? c * elements_per_row + r : r * elements_per_row + c)] = U(m.e[r][c]);
}

// d = a * b + c, accumulated in float and rounded once to the result's type.
template <class T, class A, class B, class C>
void simdgroup_multiply_accumulate(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                                   const simdgroup_matrix<B, 8, 8>& b, const simdgroup_matrix<C, 8, 8>& c) {
    struct Operands {
        simdgroup_matrix<A, 8, 8> a;
        simdgroup_matrix<B, 8, 8> b;
        simdgroup_matrix<C, 8, 8> c;
    } operands{a, b, c};
    char unused;
    emu::collective(&emu::combine_uniform<Operands>, &operands, &unused, 0);
    for (int r = 0; r < 8; ++r)
        for (int col = 0; col < 8; ++col) {
            float sum = float(c.e[r][col]);
            for (int k = 0; k < 8; ++k) sum += float(a.e[r][k]) * float(b.e[k][col]);
            d.e[r][col] = T(sum);
        }
}

template <class T, class A, class B>
void simdgroup_multiply(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                        const simdgroup_matrix<B, 8, 8>& b) {
    simdgroup_multiply_accumulate(d, a, b, simdgroup_matrix<T, 8, 8>());
}
