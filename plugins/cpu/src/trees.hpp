// Shared by trees.cpp and its per-ISA walks (trees_avx512.cpp): the 16-byte node of a forest (thresholds as double,
// float ones widened) whose interior nodes all compare one way (BRANCH_LEQ or BRANCH_LT) and whose leaves hold one weight each.
#pragma once

#include <cstdint>

#include "common.hpp"

namespace hetero {

// Interior: threshold, feature | flags, the true child; the false child is the next node (renumbered depth first).
// Leaf: the weight, target | kTreeLeaf; `yes` unused.
struct TreeNode16 {
  double threshold;
  std::uint32_t meta;
  std::int32_t yes;
};
static_assert(sizeof(TreeNode16) == 16, "TreeNode16 must be 16 bytes: the walks gather it at index * 16");
constexpr std::uint32_t kTreeLeaf = 1u << 31;
constexpr std::uint32_t kTreeMissingYes = 1u << 30;  // a NaN feature takes `yes`
constexpr std::uint32_t kTreeIndexMask = kTreeMissingYes - 1;

// Walks n (<= kTreeLanes) lanes to their leaves: lane k starts at node start[k] and reads its features at
// x + offset[k] (offset + feature < 2^31 values), so lanes are rows of one tree or trees of one row. leaf[k]: the
// leaf's node index. lt: every interior node is BRANCH_LT (else BRANCH_LEQ). The comparisons are the scalar walk's,
// in double (float features and thresholds widened exactly: the same order, NaN kept): the same leaf for every input.
constexpr int kTreeLanes = 32;
template <class X>
using TreeWalkFn = void (*)(const TreeNode16* nodes, const X* x, const std::int32_t* start,
                            const std::int32_t* offset, int n, bool lt, std::int32_t* leaf);
void tree_walk_avx512(const TreeNode16* nodes, const double* x, const std::int32_t* start,
                      const std::int32_t* offset, int n, bool lt, std::int32_t* leaf);
void tree_walk_avx512(const TreeNode16* nodes, const float* x, const std::int32_t* start,
                      const std::int32_t* offset, int n, bool lt, std::int32_t* leaf);

}  // namespace hetero
