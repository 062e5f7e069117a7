// Data-movement entry points (data.cpp).
#pragma once
#include <cstdint>

#include "common.hpp"

namespace hetero {

// out[o, i, :] = data[o, idx[i], :] for data viewed as (outer, axis_len, inner) bytes; indices pre-validated
// (negative ones count from the end).
void gather_rows(const char* data, i64 outer, i64 axis_len, i64 inner_bytes, const std::int64_t* idx, i64 nidx,
                 char* out, int nthreads);

}  // namespace hetero
