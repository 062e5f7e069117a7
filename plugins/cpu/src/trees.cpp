// ai.onnx.ml tree ensembles (TreeEnsemble, TreeEnsembleRegressor, TreeEnsembleClassifier): the forest that
// hetero.contract.trees compiles (one flat array of interior nodes and leaves) copied once into a compact array of
// structs, then every row walked through every tree and the leaf weights added per target, trees in model order, in the
// threshold type (float or double). That order is the reference's and onnxruntime's at one thread: the sums match
// bit for bit. Post transforms, labels and float16 stay in Python (a few values per row).
//
// On AVX-512, a forest with one comparison mode and one weight per leaf (LightGBM's, sklearn's regressors) walks 8-32
// rows of a block through a tree as vector lanes (trees_avx512.cpp, 16-byte nodes of trees.hpp): the same
// comparisons (float ones widened to double, exactly), so the same leaves and sums.
//
// One row of a one-target, one-mode forest: twelve branch-free chains through a copy of the 16-byte nodes whose
// leaves link to the next tree (Forest::chain_sum), at any thread count.
//
// Threads: over blocks of rows (each row's sum stays in one thread, in order); with fewer rows than twice the
// threads (a few rows), over chunks of trees (row_split: from kSplitTrees, and only while the pool's workers are
// awake), the later chunks' weights added in tree order by the caller.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include "onnx_py.hpp"
#include "trees.hpp"

namespace hetero {
namespace {

namespace py = pybind11;
using pyx::fail;

// Trees (x rows) from which a few rows split their trees over the threads (row_split): the pool's round trip with its
// workers spinning (1-2 us on this VM) against half the walk (10-40 ns a tree: repeated / new rows, forests larger
// than L2). Measured: docs/onnx-models.md (issue 17, branch tree29).
constexpr i64 kSplitTrees = 384;

// The chained one-row walk (Forest::chain_sum): kChainLanes trees walked at once, branch free; lane k walks trees
// k, k + kChainLanes, ... (each leaf's true child is that lane's next root).
constexpr int kChainLanes = 12;

enum Mode : std::uint8_t { LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF };
enum Aggregate { AVERAGE, SUM, MIN, MAX };

template <class T>
struct Node {
  T threshold;
  std::int32_t feature;
  std::int32_t yes;  // child when the comparison holds (a leaf: itself)
  std::int32_t no;   // child otherwise (right after this node: renumber)
  std::uint8_t mode;
  std::uint8_t missing_yes;  // a NaN feature takes `yes`
};

template <class T>
struct Forest {
  std::vector<Node<T>> nodes;
  std::vector<std::int32_t> roots, targets;
  std::vector<std::int32_t> pair_start, pair_count;  // per node: a leaf's (target, weight) pairs
  std::vector<std::int32_t> new_id;  // the model's node index -> this array's (renumber)
  std::vector<T> weights, base;
  std::vector<std::int32_t> member_start, member_count;  // per node (only where a BRANCH_MEMBER exists)
  std::vector<T> members;
  i64 n_targets = 0, n_features = 0;
  Aggregate aggregate = SUM;
  int uniform = -1;  // the one mode of every interior node (LEQ / LT), else -1: walks with no switch
  // Every leaf has one (target, weight) pair (TreeEnsemble's leaves always): kept in the leaf node itself (target
  // in `feature`, weight in `threshold`), which the walk has just read.
  bool single = false;
  // The 16-byte copy of the nodes for the vector walk (trees.hpp): thresholds as double, one mode (uniform), single
  // leaves, every false child right after its parent; empty otherwise.
  std::vector<TreeNode16> packed;
  std::size_t n_reached = 0;  // nodes a root reaches: renumbered first (the rest after them, never walked)
  // The one-row walk's copy of `packed` (chain_sum), where the forest has one target and no shared node. Every
  // node compares a value of chain_x (below) with its threshold and takes `yes` (here: bytes from the next node) or
  // the next node, with no other case: a node whose NaN goes `yes` reads the feature's copy with NaN as -inf; a leaf
  // reads -inf at its tree's slot against its weight (always `yes`: its lane's next root, or the sink) and the walk
  // stores that weight at the slot; the sink (the last node) loops on itself. Empty otherwise.
  std::vector<TreeNode16> chain;
  std::uint64_t chain_id = 0;  // which forest last filled this thread's chain_x (chain_sum)

  // The vector walk of this CPU for this forest, or nullptr.
  TreeWalkFn<T> vector_walk() const {
#ifdef HETERO_TREES_X86
    if (!packed.empty() && std::strcmp(active().name, "avx512") == 0) return tree_walk_avx512;
#endif
    return nullptr;
  }

  // The leaves of one row x for trees [t0, t1) into leaves[0, t1 - t0): four trees side by side while the walk is
  // LEQ (the vector walk of the rows loses here: measured, see docs/onnx-models.md).
  void row_leaves(const T* x, i64 t0, i64 t1, std::int32_t* leaves) const {
    i64 t = t0;
    const T* xs[4] = {x, x, x, x};
    if (uniform == LEQ)
      for (; t + 3 < t1; t += 4) leaf4(roots.data() + t, xs, leaves + (t - t0));
    for (; t < t1; ++t) leaves[t - t0] = leaf(roots[static_cast<std::size_t>(t)], x);
  }

  template <int M>
  std::int32_t walk(std::int32_t i, const T* x) const {
    const Node<T>* nd = nodes.data();
    while (nd[i].mode != LEAF) {
      const Node<T>& n = nd[i];
      const T v = x[n.feature];
      bool c;
      if constexpr (M == LEQ) {
        c = v <= n.threshold;
      } else if constexpr (M == LT) {
        c = v < n.threshold;
      } else {
        switch (n.mode) {
          case LEQ: c = v <= n.threshold; break;
          case LT: c = v < n.threshold; break;
          case GTE: c = v >= n.threshold; break;
          case GT: c = v > n.threshold; break;
          case EQ: c = v == n.threshold; break;
          case NEQ: c = v != n.threshold; break;
          default: {  // MEMBER
            c = false;
            const T* m = members.data() + member_start[static_cast<std::size_t>(i)];
            for (std::int32_t k = 0, e = member_count[static_cast<std::size_t>(i)]; k < e; ++k) c = c || v == m[k];
          }
        }
      }
      c = c | (n.missing_yes & (v != v));  // no short circuit: one more unpredictable branch otherwise
      i = c ? n.yes : n.no;
    }
    return i;
  }

  // Two walks of one tree at once (rows a and b): two independent load-compare-select chains per step, each
  // stopping at its own leaf.
  void leaf2(std::int32_t root, const T* xa, const T* xb, std::int32_t& la, std::int32_t& lb) const {
    if (uniform != LEQ) {
      la = leaf(root, xa);
      lb = leaf(root, xb);
      return;
    }
    const Node<T>* nd = nodes.data();
    std::int32_t a = root, b = root;
    while (nd[a].mode != LEAF && nd[b].mode != LEAF) {
      const Node<T>& na = nd[a];
      const Node<T>& nb = nd[b];
      const T va = xa[na.feature], vb = xb[nb.feature];
      const bool ca = (va <= na.threshold) | (na.missing_yes & (va != va));
      const bool cb = (vb <= nb.threshold) | (nb.missing_yes & (vb != vb));
      a = ca ? na.yes : na.no;
      b = cb ? nb.yes : nb.no;
    }
    la = walk<LEQ>(a, xa);
    lb = walk<LEQ>(b, xb);
  }

  // Four walks at once, as leaf2: four rows through one tree, or one row through four trees (roots r4).
  void leaf4(const std::int32_t* r4, const T* const* xs, std::int32_t* out) const {
    const Node<T>* nd = nodes.data();
    std::int32_t i[4] = {r4[0], r4[1], r4[2], r4[3]};
    while (nd[i[0]].mode != LEAF && nd[i[1]].mode != LEAF && nd[i[2]].mode != LEAF && nd[i[3]].mode != LEAF) {
      for (int k = 0; k < 4; ++k) {
        const Node<T>& n = nd[i[k]];
        const T v = xs[k][n.feature];
        const bool c = (v <= n.threshold) | (n.missing_yes & (v != v));
        i[k] = c ? n.yes : n.no;
      }
    }
    for (int k = 0; k < 4; ++k) out[k] = walk<LEQ>(i[k], xs[k]);
  }

  // One row's sum of every tree's leaf weight, in tree order (the sums of row_sum, bit for bit). Why: leaf4 / walk
  // wait on each node's load and compare in turn, and stop together at the first lane's leaf; here kChainLanes
  // independent chains run to their lane's last tree, a step being a load, a compare and a select with no
  // data-dependent branch (the same speed on a repeated row as on new ones).
  template <bool LT>
  T chain_sum(const T* x) const {
    const i64 n_trees = static_cast<i64>(roots.size()), F = n_features;
    // chain_x: [0, F) the features, [F, 2F) the same with NaN as -inf, [2F, 2F + trees] -inf (leaves, sink);
    // chain_w: the value each step stores at its node's index (a leaf's weight at its tree's slot)
    thread_local std::vector<double> chain_x, chain_w;
    thread_local std::uint64_t filled_by = 0;
    const std::size_t size = static_cast<std::size_t>(2 * F + n_trees + 1);
    if (chain_x.size() < size) {
      chain_x.assign(size, -INFINITY);
      chain_w.assign(size, 0.0);
    } else if (filled_by != chain_id) {  // another forest's features may lie in this one's slots
      std::fill(chain_x.begin() + 2 * F, chain_x.begin() + static_cast<std::ptrdiff_t>(size), -INFINITY);
    }
    filled_by = chain_id;
    double* xp = chain_x.data();
    for (i64 f = 0; f < F; ++f) {
      const double v = static_cast<double>(x[f]);  // float: exact
      xp[f] = v;
      xp[F + f] = v != v ? -INFINITY : v;
    }
    double* lw = chain_w.data();
    const char* P = reinterpret_cast<const char*>(chain.data());
    const i64 step = static_cast<i64>(sizeof(TreeNode16));
    const i64 sink = static_cast<i64>(chain.size() - 1) * step;
    i64 o[kChainLanes];  // byte offsets of each lane's node (64-bit: addressed with no extension)
    for (int k = 0; k < kChainLanes; ++k) o[k] = k < n_trees ? roots[static_cast<std::size_t>(k)] * step : sink;
    for (;;) {
      for (int rep = 0; rep < 2; ++rep)
        for (int k = 0; k < kChainLanes; ++k) {
          const TreeNode16& n = *reinterpret_cast<const TreeNode16*>(P + o[k]);
          const double v = xp[n.meta];
          lw[n.meta] = n.threshold;
          const i64 c = static_cast<i64>(LT ? v < n.threshold : v <= n.threshold);
          // a mask, not a select: a compiler may turn a select into a branch, which would guess the row
          o[k] += step + (static_cast<i64>(n.yes) & -c);
        }
      i64 low = o[0];
      for (int k = 1; k < kChainLanes; ++k) low = std::min(low, o[k]);
      if (low == sink) break;
    }
    T s = 0;
    for (i64 t = 0; t < n_trees; ++t) s += static_cast<T>(lw[2 * F + t]);
    return s;
  }

  // One row's leaf weights of trees [t0, t1) in tree order, sink(target, weight) (single leaves: the leaf node's own).
  template <class Sink>
  void row_sum(const T* x, i64 t0, i64 t1, Sink&& sink) const {
    std::int32_t lv[kTreeLanes];
    for (i64 t = t0; t < t1; t += kTreeLanes) {
      const i64 e = std::min<i64>(t1, t + kTreeLanes);
      row_leaves(x, t, e, lv);
      for (i64 k = 0; k < e - t; ++k) {
        const Node<T>& f = nodes[static_cast<std::size_t>(lv[k])];
        sink(f.feature, f.threshold);
      }
    }
  }

  std::int32_t leaf(std::int32_t root, const T* x) const {
    if (uniform == LEQ) return walk<LEQ>(root, x);
    if (uniform == LT) return walk<LT>(root, x);
    return walk<-1>(root, x);
  }

  // Adds the leaf's pairs to one row's scores (hit: whether a target got any).
  void add(std::int32_t leaf_node, T* s, std::uint8_t* hit) const {
    if (single) {
      const Node<T>& n = nodes[static_cast<std::size_t>(leaf_node)];
      const std::int32_t t = n.feature;
      const T w = n.threshold;
      switch (aggregate) {
        case MIN: s[t] = hit[t] ? (w < s[t] ? w : s[t]) : w; break;
        case MAX: s[t] = hit[t] ? (w > s[t] ? w : s[t]) : w; break;
        default: s[t] += w;
      }
      hit[t] = 1;
      return;
    }
    const std::size_t at = static_cast<std::size_t>(leaf_node);
    for (std::int32_t k = pair_start[at], e = pair_start[at] + pair_count[at]; k < e; ++k) {
      const std::int32_t t = targets[static_cast<std::size_t>(k)];
      const T w = weights[static_cast<std::size_t>(k)];
      switch (aggregate) {
        case MIN: s[t] = hit[t] ? (w < s[t] ? w : s[t]) : w; break;
        case MAX: s[t] = hit[t] ? (w > s[t] ? w : s[t]) : w; break;
        default: s[t] += w;
      }
      hit[t] = 1;
    }
  }

  void finish(T* s) const {
    if (aggregate == AVERAGE) {
      const T n = static_cast<T>(roots.size());
      for (i64 t = 0; t < n_targets; ++t) s[t] /= n;
    }
    if (!base.empty())
      for (i64 t = 0; t < n_targets; ++t) s[t] += base[static_cast<std::size_t>(t)];
  }

  // A few rows (one: a served model's usual request) at nt threads: the trees split into nt chunks. A chunk whose
  // predecessors have all been added (chunk 0; any chunk the caller runs after them, as when the pool's workers are
  // asleep and every chunk runs here) adds its weights into the rows' scores as it walks; the others keep each
  // tree's (target, weight), which the caller adds in tree order after the join: the 1-thread sums, bit for bit.
  void row_split(const T* x, i64 rows, i64 stride, T* out, int nt) const {
    const i64 n_trees = static_cast<i64>(roots.size());
    thread_local std::vector<T> w_buf;
    thread_local std::vector<std::int32_t> t_buf;
    if (static_cast<i64>(w_buf.size()) < rows * n_trees) {
      w_buf.resize(static_cast<std::size_t>(rows * n_trees));
      t_buf.resize(static_cast<std::size_t>(rows * n_trees));
    }
    T* wp = w_buf.data();
    std::int32_t* tp = t_buf.data();
    for (i64 r = 0; r < rows; ++r) std::fill(out + r * n_targets, out + (r + 1) * n_targets, T(0));
    std::atomic<i64> added{0};  // trees [0, added) are in the scores
    parallel_for(
        nt, nt,
        [&](i64 c) {
          const i64 t0 = n_trees * c / nt, t1 = n_trees * (c + 1) / nt;
          const bool direct = added.load(std::memory_order_acquire) == t0;
          for (i64 r = 0; r < rows; ++r) {
            const T* xr = x + r * stride;
            if (direct) {
              T* s = out + r * n_targets;
              row_sum(xr, t0, t1, [s](std::int32_t tg, T w) { s[tg] += w; });
            } else {
              T* ws = wp + r * n_trees + t0;
              std::int32_t* ts = tp + r * n_trees + t0;
              row_sum(xr, t0, t1, [&ws, &ts](std::int32_t tg, T w) { *ws++ = w, *ts++ = tg; });
            }
          }
          if (direct) added.store(t1, std::memory_order_release);
        },
        false);
    const i64 from = added.load(std::memory_order_acquire);
    for (i64 r = 0; r < rows; ++r) {
      T* s = out + r * n_targets;
      const T* ws = wp + r * n_trees;
      if (n_targets == 1) {  // in a register: one add per tree, not a store-to-load chain
        T a = s[0];
        for (i64 t = from; t < n_trees; ++t) a += ws[t];
        s[0] = a;
      } else {
        const std::int32_t* ts = tp + r * n_trees;
        for (i64 t = from; t < n_trees; ++t) s[ts[t]] += ws[t];
      }
      finish(s);
    }
  }

  // out[rows, n_targets] (and hit, same shape, when given) for x[rows, stride].
  void run(const T* x, i64 rows, i64 stride, T* out, std::uint8_t* hit_out) const {
    const i64 n_trees = static_cast<i64>(roots.size());
    const double work = static_cast<double>(rows) * static_cast<double>(n_trees) * 8.0;
    const int threads = threads_for(work, kWakeElementWork / 4);
    std::vector<std::uint8_t> scratch_hit;
    // hit only matters to MIN / MAX and to the classifier (which asks for it)
    const bool sum_single = single && (aggregate == SUM || aggregate == AVERAGE) && !hit_out;
    const int nt = num_threads();
    // one row with the chain: its walk alone beats a split of the older walk (docs/onnx-models.md, branch misc30)
    if (sum_single && nt > 1 && rows < 2 * nt && rows * n_trees >= kSplitTrees && (rows > 1 || chain.empty())) {
      row_split(x, rows, stride, out, nt);
      return;
    }
    const TreeWalkFn<T> vw = sum_single ? vector_walk() : nullptr;
    // the vector walk's lanes address a block's rows as int32 offsets into it
    const bool vw_rows = vw != nullptr && static_cast<double>(stride) * kTreeLanes < 2147483647.0;
    std::int32_t row_offset[kTreeLanes];
    for (int k = 0; k < kTreeLanes; ++k) row_offset[k] = vw_rows ? static_cast<std::int32_t>(k * stride) : 0;
    auto rows_block = [&](i64 r0, i64 r1, std::uint8_t* hits) {
      // Up to 32 rows through each tree in turn: the tree's nodes stay in L1 across them (the rows, 64 KB at 261
      // double features, in L2).
      constexpr i64 kBlock = kTreeLanes;
      for (i64 b0 = r0; b0 < r1; b0 += kBlock) {
        const i64 b1 = std::min(r1, b0 + kBlock);
        std::fill(out + b0 * n_targets, out + b1 * n_targets, T(0));
        std::fill(hits + b0 * n_targets, hits + b1 * n_targets, std::uint8_t(0));
        if (sum_single && b1 - b0 == 1 && !chain.empty()) {  // one row: the chained walk
          out[b0] = uniform == LT ? chain_sum<true>(x + b0 * stride) : chain_sum<false>(x + b0 * stride);
        } else if (sum_single && b1 - b0 == 1) {  // one row: trees side by side, added in order
          T* s = out + b0 * n_targets;
          row_sum(x + b0 * stride, 0, n_trees, [s](std::int32_t tg, T w) { s[tg] += w; });
        } else if (sum_single && vw && vw_rows) {  // up to kTreeLanes rows through each tree as vector lanes
          std::int32_t start[kTreeLanes], lv[kTreeLanes];
          const int n = static_cast<int>(b1 - b0);
          for (i64 t = 0; t < n_trees; ++t) {
            std::fill(start, start + n, roots[static_cast<std::size_t>(t)]);
            vw(packed.data(), x + b0 * stride, start, row_offset, n, uniform == LT, lv);
            for (int k = 0; k < n; ++k) {
              const Node<T>& f = nodes[static_cast<std::size_t>(lv[k])];
              out[(b0 + k) * n_targets + f.feature] += f.threshold;
            }
          }
        } else if (sum_single) {  // summed one-pair leaves: the leaf's weight straight into its target's score
          for (i64 t = 0; t < n_trees; ++t) {
            const std::int32_t root = roots[static_cast<std::size_t>(t)];
            i64 r = b0;
            if (uniform == LEQ)
              for (; r + 3 < b1; r += 4) {
                const T* xs[4] = {x + r * stride, x + (r + 1) * stride, x + (r + 2) * stride, x + (r + 3) * stride};
                std::int32_t lv[4];
                const std::int32_t r4[4] = {root, root, root, root};
                leaf4(r4, xs, lv);
                for (int k = 0; k < 4; ++k) {
                  const Node<T>& f = nodes[static_cast<std::size_t>(lv[k])];
                  out[(r + k) * n_targets + f.feature] += f.threshold;
                }
              }
            for (; r + 1 < b1; r += 2) {
              std::int32_t la, lb;
              leaf2(root, x + r * stride, x + (r + 1) * stride, la, lb);
              const Node<T>& fa = nodes[static_cast<std::size_t>(la)];
              const Node<T>& fb = nodes[static_cast<std::size_t>(lb)];
              out[r * n_targets + fa.feature] += fa.threshold;
              out[(r + 1) * n_targets + fb.feature] += fb.threshold;
            }
            for (; r < b1; ++r) {
              const Node<T>& lf = nodes[static_cast<std::size_t>(leaf(root, x + r * stride))];
              out[r * n_targets + lf.feature] += lf.threshold;
            }
          }
        } else {
          for (i64 t = 0; t < n_trees; ++t) {
            const std::int32_t root = roots[static_cast<std::size_t>(t)];
            for (i64 r = b0; r < b1; ++r) add(leaf(root, x + r * stride), out + r * n_targets, hits + r * n_targets);
          }
        }
        for (i64 r = b0; r < b1; ++r) finish(out + r * n_targets);
      }
    };
    std::uint8_t* hits = hit_out;
    if (hits == nullptr) {
      scratch_hit.resize(static_cast<std::size_t>(rows * n_targets));
      hits = scratch_hit.data();
    }
    if (threads <= 1 || rows >= 2 * threads) {
      const i64 chunks = threads <= 1 ? 1 : std::min<i64>(rows, 4 * threads);
      parallel_for(chunks, threads, [&](i64 c) { rows_block(rows * c / chunks, rows * (c + 1) / chunks, hits); });
      return;
    }
    // Few rows: the leaves found by tree chunks in parallel, then each row summed in tree order.
    std::vector<std::int32_t> leaves(static_cast<std::size_t>(rows * n_trees));
    const i64 chunks = std::min<i64>(n_trees, 4 * threads);
    parallel_for(chunks, threads, [&](i64 c) {
      const i64 t0 = n_trees * c / chunks, t1 = n_trees * (c + 1) / chunks;
      for (i64 r = 0; r < rows; ++r) row_leaves(x + r * stride, t0, t1, leaves.data() + r * n_trees + t0);
    });
    for (i64 r = 0; r < rows; ++r) {
      T* s = out + r * n_targets;
      std::uint8_t* h = hits + r * n_targets;
      std::fill(s, s + n_targets, T(0));
      std::fill(h, h + n_targets, std::uint8_t(0));
      for (i64 t = 0; t < n_trees; ++t) add(leaves[static_cast<std::size_t>(r * n_trees + t)], s, h);
      finish(s);
    }
  }
};

template <class T>
std::vector<T> values_of(const py::array& a) {
  py::array_t<T, py::array::c_style | py::array::forcecast> c(a);
  return std::vector<T>(c.data(), c.data() + c.size());
}

// The forest of hetero.contract.trees.Forest, for float or double features.
class PyTreeForest {
 public:
  PyTreeForest(const py::array& feature, const py::array& threshold, const py::array& mode, const py::array& yes,
               const py::array& no, const py::array& missing_yes, const py::array& leaf_start,
               const py::array& leaf_count, const py::array& targets, const py::array& weights,
               const py::array& roots, i64 n_targets, const std::string& aggregate, const py::array& base,
               const py::list& members) {
    const std::string key = pyx::dkey(threshold);
    if (key == "f8") {
      is_double_ = true;
      build(d_, feature, threshold, mode, yes, no, missing_yes, leaf_start, leaf_count, targets, weights, roots,
            n_targets, aggregate, base, members);
    } else if (key == "f4") {
      build(f_, feature, threshold, mode, yes, no, missing_yes, leaf_start, leaf_count, targets, weights, roots,
            n_targets, aggregate, base, members);
    } else {
      fail("TreeForest: thresholds must be float32 or float64, got " + std::string(py::str(threshold.dtype())));
    }
  }

  bool is_double() const { return is_double_; }
  i64 n_targets() const { return is_double_ ? d_.n_targets : f_.n_targets; }
  i64 n_features() const { return is_double_ ? d_.n_features : f_.n_features; }
  bool vector_layout() const { return is_double_ ? !d_.packed.empty() : !f_.packed.empty(); }
  bool one_row_chain() const { return is_double_ ? !d_.chain.empty() : !f_.chain.empty(); }
  i64 n_trees() const { return static_cast<i64>(is_double_ ? d_.roots.size() : f_.roots.size()); }

  void run(const py::array& x, const py::array& out, const py::object& hit) const {
    const char* fn = "tree_ensemble";
    if (pyx::dkey(x) != (is_double_ ? "f8" : "f4") || pyx::dkey(out) != pyx::dkey(x))
      fail(std::string(fn) + ": x and out must be " + (is_double_ ? "float64" : "float32") + " as the thresholds");
    if (x.ndim() != 2) fail(std::string(fn) + ": x must be 2-D, got " + pyx::shape_str(x));
    pyx::need_contig(x, fn, "x");
    pyx::need_out(out, fn);
    const i64 rows = x.shape(0), width = x.shape(1);
    if (width < n_features())
      fail(std::string(fn) + ": x has " + std::to_string(width) + " features; the trees read feature " +
           std::to_string(n_features() - 1));
    pyx::need_shape(out, {rows, n_targets()}, fn, "out");
    std::uint8_t* h = nullptr;
    if (!hit.is_none()) {
      py::array ha = hit.cast<py::array>();
      if (pyx::dkey(ha) != "u1" && pyx::dkey(ha) != "b1") fail(std::string(fn) + ": hit must be uint8 or bool");
      pyx::need_out(ha, fn, "hit");
      pyx::need_shape(ha, {rows, n_targets()}, fn, "hit");
      h = pyx::mptr<std::uint8_t>(ha);
    }
    if (rows == 0) return;
    py::gil_scoped_release release;
    if (is_double_)
      d_.run(pyx::cptr<double>(x), rows, width, pyx::mptr<double>(out), h);
    else
      f_.run(pyx::cptr<float>(x), rows, width, pyx::mptr<float>(out), h);
  }

 private:
  template <class T>
  static void build(Forest<T>& f, const py::array& feature, const py::array& threshold, const py::array& mode,
                    const py::array& yes, const py::array& no, const py::array& missing_yes,
                    const py::array& leaf_start, const py::array& leaf_count, const py::array& targets,
                    const py::array& weights, const py::array& roots, i64 n_targets, const std::string& aggregate,
                    const py::array& base, const py::list& members) {
    const auto feat = values_of<std::int64_t>(feature), yv = values_of<std::int64_t>(yes),
               nv = values_of<std::int64_t>(no), ls = values_of<std::int64_t>(leaf_start),
               lc = values_of<std::int64_t>(leaf_count), tg = values_of<std::int64_t>(targets),
               rt = values_of<std::int64_t>(roots);
    const auto th = values_of<T>(threshold);
    const auto md = values_of<std::uint8_t>(mode), my = values_of<std::uint8_t>(missing_yes);
    const std::size_t n = feat.size();
    if (th.size() != n || md.size() != n || yv.size() != n || nv.size() != n || my.size() != n ||
        ls.size() != n || lc.size() != n)
      fail("TreeForest: the node arrays differ in length");
    f.weights = values_of<T>(weights);
    if (tg.size() != f.weights.size()) fail("TreeForest: targets and weights differ in length");
    if (n_targets < 1) fail("TreeForest: n_targets must be >= 1");
    f.n_targets = n_targets;
    for (const auto t : tg)
      if (t < 0 || t >= n_targets) fail("TreeForest: a target id is out of range");
    f.targets.assign(tg.begin(), tg.end());
    f.nodes.resize(n);
    f.pair_start.assign(n, 0);
    f.pair_count.assign(n, 0);
    int uniform = -2;
    for (std::size_t i = 0; i < n; ++i) {
      Node<T>& d = f.nodes[i];
      d.mode = md[i];
      d.missing_yes = my[i] != 0;
      d.threshold = th[i];
      if (d.mode == LEAF) {
        if (ls[i] < 0 || lc[i] < 0 || ls[i] + lc[i] > static_cast<i64>(tg.size()))
          fail("TreeForest: a leaf's weights are out of range");
        d.feature = 0;
        d.yes = d.no = static_cast<std::int32_t>(i);
        f.pair_start[i] = static_cast<std::int32_t>(ls[i]);
        f.pair_count[i] = static_cast<std::int32_t>(lc[i]);
        continue;
      }
      if (d.mode > MEMBER) fail("TreeForest: unknown node mode " + std::to_string(d.mode));
      if (yv[i] < 0 || nv[i] < 0 || yv[i] >= static_cast<i64>(n) || nv[i] >= static_cast<i64>(n) || feat[i] < 0)
        fail("TreeForest: a child or feature index is out of range");
      d.feature = static_cast<std::int32_t>(feat[i]);
      d.yes = static_cast<std::int32_t>(yv[i]);
      d.no = static_cast<std::int32_t>(nv[i]);
      f.n_features = std::max<i64>(f.n_features, feat[i] + 1);
      // a node whose two branches agree (TreeEnsemble's single-leaf tree) compares nothing: any mode walks it
      if (yv[i] != nv[i]) uniform = uniform == -2 ? d.mode : (uniform == d.mode ? uniform : -1);
    }
    f.uniform = (uniform == LEQ || uniform == LT) ? uniform : -1;
    f.single = true;
    for (std::size_t i = 0; i < n; ++i)
      if (f.nodes[i].mode == LEAF && f.pair_count[i] != 1) f.single = false;
    if (f.single)
      for (std::size_t i = 0; i < n; ++i)
        if (f.nodes[i].mode == LEAF) {
          f.nodes[i].feature = f.targets[static_cast<std::size_t>(f.pair_start[i])];
          f.nodes[i].threshold = f.weights[static_cast<std::size_t>(f.pair_start[i])];
        }
    for (const auto r : rt)
      if (r < 0 || r >= static_cast<i64>(n)) fail("TreeForest: a root is out of range");
    f.roots.assign(rt.begin(), rt.end());
    if (aggregate == "SUM") f.aggregate = SUM;
    else if (aggregate == "AVERAGE") f.aggregate = AVERAGE;
    else if (aggregate == "MIN") f.aggregate = MIN;
    else if (aggregate == "MAX") f.aggregate = MAX;
    else fail("TreeForest: unknown aggregate " + aggregate);
    if (base.size() != 0) {
      f.base = values_of<T>(base);
      if (static_cast<i64>(f.base.size()) != n_targets) fail("TreeForest: base has the wrong length");
    }
    renumber(f, n);
    pack(f, n);
    if (!members.empty()) {
      f.member_start.assign(n, 0);
      f.member_count.assign(n, 0);
      for (const auto& item : members) {
        const py::tuple pair = item.cast<py::tuple>();
        const i64 given = pair[0].cast<i64>();
        if (given < 0 || given >= static_cast<i64>(n)) fail("TreeForest: a member set names a node out of range");
        const i64 node = f.new_id[static_cast<std::size_t>(given)];
        if (node < 0 || node >= static_cast<i64>(n) || f.nodes[static_cast<std::size_t>(node)].mode != MEMBER)
          fail("TreeForest: a member set names a node that is not BRANCH_MEMBER");
        const auto vals = values_of<T>(pair[1].cast<py::array>());
        f.member_start[static_cast<std::size_t>(node)] = static_cast<std::int32_t>(f.members.size());
        f.member_count[static_cast<std::size_t>(node)] = static_cast<std::int32_t>(vals.size());
        f.members.insert(f.members.end(), vals.begin(), vals.end());
      }
    }
    for (std::size_t i = 0; i < n; ++i)
      if (f.nodes[i].mode == MEMBER && f.member_start.empty()) fail("TreeForest: a BRANCH_MEMBER node has no set");
  }

  // Nodes renumbered tree by tree in depth-first order with each false child right after its parent: a walk
  // reads nearby nodes (one cache line often holds the next step).
  template <class T>
  static void renumber(Forest<T>& f, std::size_t n) {
    std::vector<std::int32_t>& id = f.new_id;
    id.assign(n, -1);
    std::vector<std::int32_t> order, stack;
    order.reserve(n);
    for (const auto root : f.roots) {
      stack.assign(1, root);
      while (!stack.empty()) {
        const std::int32_t i = stack.back();
        stack.pop_back();
        if (id[static_cast<std::size_t>(i)] >= 0) continue;
        id[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(order.size());
        order.push_back(i);
        const Node<T>& nd = f.nodes[static_cast<std::size_t>(i)];
        if (nd.mode == LEAF) continue;
        stack.push_back(nd.yes);
        stack.push_back(nd.no);  // popped next: right after its parent
      }
    }
    f.n_reached = order.size();
    for (std::size_t i = 0; i < n; ++i)
      if (id[i] < 0) {
        id[i] = static_cast<std::int32_t>(order.size());
        order.push_back(static_cast<std::int32_t>(i));
      }
    std::vector<Node<T>> nodes(n);
    std::vector<std::int32_t> ps(n), pc(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t old = static_cast<std::size_t>(order[k]);
      Node<T> nd = f.nodes[old];
      nd.yes = id[static_cast<std::size_t>(nd.yes)];
      nd.no = id[static_cast<std::size_t>(nd.no)];
      nodes[k] = nd;
      ps[k] = f.pair_start[old];
      pc[k] = f.pair_count[old];
    }
    f.nodes.swap(nodes);
    f.pair_start.swap(ps);
    f.pair_count.swap(pc);
    for (auto& r : f.roots) r = id[static_cast<std::size_t>(r)];
  }

  // The 16-byte nodes of the vector walk, where the forest is one the walk takes (trees.hpp).
  template <class T>
  static void pack(Forest<T>& f, std::size_t n) {
    if (!f.single || f.uniform < 0 || n >= kTreeIndexMask || f.n_features >= kTreeIndexMask ||
        f.n_targets >= kTreeIndexMask)
      return;
    std::vector<TreeNode16> p(n);
    for (std::size_t i = 0; i < n; ++i) {
      const Node<T>& d = f.nodes[i];
      p[i].threshold = static_cast<double>(d.threshold);  // float: exact
      p[i].meta = static_cast<std::uint32_t>(d.feature);
      if (d.mode == LEAF || i >= f.n_reached) {
        p[i].meta |= kTreeLeaf;
        p[i].yes = static_cast<std::int32_t>(i);
        continue;
      }
      if (d.no != static_cast<std::int32_t>(i) + 1) return;  // a shared subtree: renumber could not place it
      if (d.missing_yes) p[i].meta |= kTreeMissingYes;
      p[i].yes = d.yes;
    }
    f.packed.swap(p);
    chain(f);
  }

  // The chained walk's nodes (Forest::chain).
  template <class T>
  static void chain(Forest<T>& f) {
    const std::size_t n_trees = f.roots.size();
    const std::size_t F = static_cast<std::size_t>(f.n_features);
    if (f.n_targets != 1 || n_trees < static_cast<std::size_t>(kChainLanes) ||
        (f.packed.size() + 1) * sizeof(TreeNode16) >= (1u << 31) || 2 * F + n_trees + 1 >= (1u << 31))
      return;
    const bool lt = f.uniform == LT;
    std::vector<TreeNode16> c(f.packed);
    const std::int32_t sink = static_cast<std::int32_t>(c.size());
    const std::int32_t at = static_cast<std::int32_t>(sizeof(TreeNode16));
    c.push_back(TreeNode16{0.0, static_cast<std::uint32_t>(2 * F + n_trees), -at});  // `yes`: itself
    std::vector<std::uint8_t> seen(c.size(), 0);
    std::vector<std::int32_t> stack;
    for (std::size_t t = 0; t < n_trees; ++t) {
      const std::size_t later = t + static_cast<std::size_t>(kChainLanes);
      const std::int32_t next = later < n_trees ? f.roots[later] : sink;
      stack.assign(1, f.roots[t]);
      while (!stack.empty()) {
        const std::int32_t i = stack.back();
        stack.pop_back();
        if (seen[static_cast<std::size_t>(i)]) return;  // reached twice (a shared node): no chain
        seen[static_cast<std::size_t>(i)] = 1;
        TreeNode16& nd = c[static_cast<std::size_t>(i)];
        if (nd.meta & kTreeLeaf) {
          const double w = static_cast<double>(f.nodes[static_cast<std::size_t>(i)].threshold);
          if (!std::isfinite(w)) return;  // -inf <(=) w must hold
          nd = TreeNode16{w, static_cast<std::uint32_t>(2 * F + t), (next - i - 1) * at};
          continue;
        }
        const bool both = nd.yes == i + 1;  // a single-leaf tree's root: both branches name the next node
        // NaN: false as the walk's compare; -inf: the NaN copy's value, which must take `yes` under LT too
        if (!both && (std::isnan(nd.threshold) || (lt && nd.threshold == -INFINITY))) return;
        const bool nan_yes = (nd.meta & kTreeMissingYes) != 0;
        const std::uint32_t feature = nd.meta & kTreeIndexMask;
        if (!both) stack.push_back(nd.yes);
        stack.push_back(i + 1);
        nd.meta = feature + (nan_yes ? static_cast<std::uint32_t>(F) : 0u);
        nd.yes = (nd.yes - i - 1) * at;
      }
    }
    static std::atomic<std::uint64_t> forests{0};
    f.chain_id = ++forests;
    f.chain.swap(c);
  }

  bool is_double_ = false;
  Forest<float> f_;
  Forest<double> d_;
};

void py_tree_ensemble(const PyTreeForest& forest, const py::array& x, const py::array& out) {
  forest.run(x, out, py::none());
}

}  // namespace

void bind_trees(py::module_& m) {
  py::class_<PyTreeForest>(m, "TreeForest",
                           "A tree ensemble (hetero.contract.trees.Forest) flattened once for tree_ensemble.")
      .def(py::init<const py::array&, const py::array&, const py::array&, const py::array&, const py::array&,
                    const py::array&, const py::array&, const py::array&, const py::array&, const py::array&,
                    const py::array&, i64, const std::string&, const py::array&, const py::list&>(),
           py::arg("feature"), py::arg("threshold"), py::arg("mode"), py::arg("true_child"), py::arg("false_child"),
           py::arg("missing_true"), py::arg("leaf_start"), py::arg("leaf_count"), py::arg("targets"),
           py::arg("weights"), py::arg("roots"), py::arg("n_targets"), py::arg("aggregate"), py::arg("base"),
           py::arg("members"))
      .def_property_readonly("is_double", &PyTreeForest::is_double)
      .def_property_readonly("n_targets", &PyTreeForest::n_targets)
      .def_property_readonly("n_features", &PyTreeForest::n_features)
      .def_property_readonly("n_trees", &PyTreeForest::n_trees)
      .def_property_readonly("vector_layout", &PyTreeForest::vector_layout,
                             "Whether the forest has the 16-byte nodes of the vector walk (trees.hpp).")
      .def_property_readonly("one_row_chain", &PyTreeForest::one_row_chain,
                             "Whether one-row calls take the chained walk (Forest::chain_sum).")
      .def("run", &PyTreeForest::run, py::arg("x"), py::arg("out"), py::arg("hit") = py::none(),
           "out[rows, n_targets] = the aggregated leaf weights (+ base) of contiguous x[rows, >= n_features] "
           "(float32 or float64, the thresholds' type); hit (uint8, same shape, optional): whether a leaf fed "
           "each score.");
  m.def("tree_ensemble", &py_tree_ensemble, py::arg("forest"), py::arg("x"), py::arg("out"),
        "forest.run(x, out): the bound call of the cpu tree-ensemble kernel.");
}

}  // namespace hetero
