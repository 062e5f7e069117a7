// Data movement: Reshape and the other views (where the session cannot make a view), Transpose, Slice, Expand and
// Concat as one strided copy per input, y[dst_offset + sum(i_d * dst_stride_d)] = x[src_offset + sum(i_d *
// src_stride_d)] over the multi-index i of dims. meta holds dims, then the source's strides, then the
// destination's (elements; a source stride is 0 where it broadcasts, negative for a reversed slice). One thread
// per element, a kernel per element size (the bytes are moved, whatever the type). Gather at the end.

#define COPY_MAX_RANK 8

struct CopyParams {
    uint n;        // elements to copy
    uint rank;
    int src_offset;
    int dst_offset;
};

static inline void copy_offsets(uint i, device const int* meta, uint rank, thread int& src, thread int& dst) {
    for (uint d = rank; d-- > 0;) {
        const uint dim = uint(meta[d]);
        const int at = int(i % dim);
        i /= dim;
        src += at * meta[rank + d];
        dst += at * meta[2 * rank + d];
    }
}

kernel void copy_u8(device const uchar* x [[buffer(0)]], device uchar* y [[buffer(1)]],
                    device const int* meta [[buffer(2)]], constant CopyParams& p [[buffer(3)]],
                    uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    int src = p.src_offset, dst = p.dst_offset;
    copy_offsets(i, meta, p.rank, src, dst);
    y[dst] = x[src];
}

kernel void copy_u16(device const ushort* x [[buffer(0)]], device ushort* y [[buffer(1)]],
                     device const int* meta [[buffer(2)]], constant CopyParams& p [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    int src = p.src_offset, dst = p.dst_offset;
    copy_offsets(i, meta, p.rank, src, dst);
    y[dst] = x[src];
}

kernel void copy_u32(device const uint* x [[buffer(0)]], device uint* y [[buffer(1)]],
                     device const int* meta [[buffer(2)]], constant CopyParams& p [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    int src = p.src_offset, dst = p.dst_offset;
    copy_offsets(i, meta, p.rank, src, dst);
    y[dst] = x[src];
}

kernel void copy_u64(device const long* x [[buffer(0)]], device long* y [[buffer(1)]],
                     device const int* meta [[buffer(2)]], constant CopyParams& p [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    int src = p.src_offset, dst = p.dst_offset;
    copy_offsets(i, meta, p.rank, src, dst);
    y[dst] = x[src];
}

// Gather along one axis: y[o, i, r] = x[o, idx[i] (+ axis_dim when negative), r] over outer o, index i, inner r.
struct GatherParams {
    uint n;         // output elements
    uint indices;
    uint inner;
    uint axis_dim;
};

static inline uint gather_source(uint e, device const long* idx, constant GatherParams& p) {
    const uint r = e % p.inner, i = (e / p.inner) % p.indices, o = e / (p.inner * p.indices);
    const long at = idx[i] < 0 ? idx[i] + long(p.axis_dim) : idx[i];  // in range: checked on the host
    return (o * p.axis_dim + uint(at)) * p.inner + r;
}

kernel void gather_u32(device const uint* x [[buffer(0)]], device const long* idx [[buffer(1)]],
                       device uint* y [[buffer(2)]], constant GatherParams& p [[buffer(3)]],
                       uint e [[thread_position_in_grid]]) {
    if (e < p.n) y[e] = x[gather_source(e, idx, p)];
}

kernel void gather_u64(device const long* x [[buffer(0)]], device const long* idx [[buffer(1)]],
                       device long* y [[buffer(2)]], constant GatherParams& p [[buffer(3)]],
                       uint e [[thread_position_in_grid]]) {
    if (e < p.n) y[e] = x[gather_source(e, idx, p)];
}

// Cast between float, half, int, long, uchar (uint8) and bool (one byte, 0 or 1): codes as in CastParams. Floats
// convert through float, integers through long; float to integer truncates toward zero, as numpy does for finite
// values in range.
struct CastParams {
    uint n;
    uint src;  // 0 float, 1 half, 2 int, 3 long, 4 uchar, 5 bool
    uint dst;
};

kernel void cast_any(device const uchar* x [[buffer(0)]], device uchar* y [[buffer(1)]],
                     constant CastParams& p [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    float f = 0.0f;
    long v = 0;
    const bool from_float = p.src <= 1;
    switch (p.src) {
        case 0: f = ((device const float*)x)[i]; break;
        case 1: f = float(((device const half*)x)[i]); break;
        case 2: v = ((device const int*)x)[i]; break;
        case 3: v = ((device const long*)x)[i]; break;
        case 4: v = x[i]; break;
        default: v = x[i] != 0 ? 1 : 0; break;
    }
    switch (p.dst) {
        case 0: ((device float*)y)[i] = from_float ? f : float(v); break;
        case 1: ((device half*)y)[i] = half(from_float ? f : float(v)); break;
        case 2: ((device int*)y)[i] = from_float ? int(f) : int(v); break;
        case 3: ((device long*)y)[i] = from_float ? long(f) : v; break;
        case 4: y[i] = from_float ? uchar(int(f)) : uchar(v); break;
        default: y[i] = (from_float ? f != 0.0f : v != 0) ? 1 : 0; break;
    }
}
