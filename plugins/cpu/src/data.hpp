// Data-movement entry points (data.cpp).
#pragma once
#include <cstdint>

#include "common.hpp"

namespace hetero {

// out[o, i, :] = data[o, idx[i], :] for data viewed as (outer, axis_len, inner) bytes; indices pre-validated
// (negative ones count from the end).
void gather_rows(const char* data, i64 outer, i64 axis_len, i64 inner_bytes, const std::int64_t* idx, i64 nidx,
                 char* out, int nthreads);

// ScatterElements' reductions ("none" replaces).
enum class ScatterReduce { none, add, mul, max, min };

// out[q] (op)= updates[p] for every position p of the indices, q being p with q[axis] = idx[p] (indices
// pre-validated, negative ones counting from the end). out holds the data already (data's shape, C-contiguous);
// indices and updates are C-contiguous of one shape, each axis no longer than data's but along `axis`. In index
// order, one thread: repeated indices combine in the order ONNX defines.
void scatter_elements_f32(float* out, const i64* dshape, int nd, const std::int64_t* idx, const float* updates,
                          const i64* ishape, int axis, ScatterReduce reduce);

}  // namespace hetero
