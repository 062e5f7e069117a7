// Data movement (Reshape and the other views where a view cannot be made, Transpose, Slice, Expand, Concat): one
// strided copy per input, y[dst_offset + sum(i_d * dst_stride_d)] = x[src_offset + sum(i_d * src_stride_d)] over
// the multi-index i of dims. meta holds dims, then the source's strides, then the destination's (elements; a
// source stride is 0 where it broadcasts, negative for a reversed slice). One thread per element, a kernel per
// element size (the bytes are moved, whatever the type).

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
