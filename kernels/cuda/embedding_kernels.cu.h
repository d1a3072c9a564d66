// CUDA launchers behind tfde's GPU op kernels.
//
// This header has no TensorFlow in it on purpose: the same launchers are
// called by the TF op kernels' GPU functors (gpu_functors.cc, built where
// TensorFlow has CUDA) and by a small C testing API (testing_api.cu.cc) that checks them
// against the numpy oracles on any machine with nvcc and a GPU, with no
// CUDA-enabled TensorFlow needed.
//
// Conventions, as in CUB:
// - Every launcher enqueues work on `stream` and returns the first CUDA
//   error; nothing synchronizes.
// - A launcher that needs scratch memory takes `workspace` and
//   `workspace_bytes`; called with workspace == nullptr it only stores the
//   bytes it needs in *workspace_bytes.
// - Input checks run on the device before anything is written and report
//   the first offending position in `first_bad` (a device scalar that the
//   caller sets to kNoError first, see InitFirstBad); the caller copies it to
//   the host and raises an error naming the position and its value.
#ifndef TFDE_KERNELS_CUDA_EMBEDDING_KERNELS_CU_H_
#define TFDE_KERNELS_CUDA_EMBEDDING_KERNELS_CU_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../kernel_params.h"

namespace tfde {
namespace gpu {

// The combiner and the optimizers' parameters are the CPU kernels' own.
using ::tfde::AdagradParams;
using ::tfde::Combiner;
using ::tfde::FtrlParams;
using ::tfde::LazyAdamParams;
using ::tfde::MakeFtrlParams;
using ::tfde::MakeLazyAdamParams;
using ::tfde::SgdParams;

// first_bad holds the lowest offending position, or kNoError.
constexpr unsigned long long kNoError = ~0ull;
cudaError_t InitFirstBad(cudaStream_t stream, unsigned long long* first_bad);

// ---- Checks (no writes besides first_bad) ----------------------------------

// Lowest i with values[i] outside [lo, hi).
template <typename T>
cudaError_t FindOutOfRange(cudaStream_t stream, const T* values, int64_t n,
                           int64_t lo, int64_t hi, unsigned long long* first_bad);

// Lowest b where row splits break the rules: b = 0 when splits[0] != 0,
// b > 0 when splits[b] < splits[b - 1], b = batch when splits[batch] != n.
template <typename Split>
cudaError_t FindBadSplit(cudaStream_t stream, const Split* splits, int64_t batch,
                         int64_t n, unsigned long long* first_bad);

// Lowest position i whose index repeats an earlier one, packed as
// (i << 32) | first so the message can name both.
template <typename Index>
cudaError_t FindRepeatedIndex(cudaStream_t stream, const Index* indices, int64_t n,
                              void* workspace, size_t* workspace_bytes,
                              unsigned long long* first_bad);

// ---- Dedup and routing ------------------------------------------------------

// unique_ids[inverse[i]] == ids[i]; counts[k] is how often unique_ids[k]
// occurs; unique ids in order of first appearance (as the CPU kernel).
// unique_ids and counts need room for n entries; *num_unique (device) gets
// the number used.
template <typename Id>
cudaError_t UniqueWithCounts(cudaStream_t stream, const Id* ids, int64_t n,
                             void* workspace, size_t* workspace_bytes,
                             Id* unique_ids, int32_t* inverse, int32_t* counts,
                             int32_t* num_unique);

// Groups ids by shard (floor modulo), stable inside a shard: local_ids are
// id // num_shards (or the id itself when `dynamic`), positions[i] is where
// ids[i] went, shard_counts[s] the size of shard s. Static callers check for
// negative ids first (FindOutOfRange).
template <typename Id>
cudaError_t PartitionByShard(cudaStream_t stream, const Id* ids, int64_t n,
                             int32_t num_shards, bool dynamic, void* workspace,
                             size_t* workspace_bytes, Id* local_ids,
                             int32_t* shard_counts, int32_t* positions);

// ---- Gather and combine ------------------------------------------------------

// Up to kMaxTablesPerLaunch tables per launch; a group of more tables takes
// several launches over consecutive tables, each writing only the rows of
// its own tables. Tables of a group cover consecutive row ranges starting at
// row 0 with no holes (the op checks this), so a row belongs to the last
// table whose base is <= the row.
constexpr int kMaxTablesPerLaunch = 64;
struct TableGroup {
  const float* data[kMaxTablesPerLaunch];
  int64_t base[kMaxTablesPerLaunch];  // first group row of each table
  int64_t end;                        // first group row after these tables
  int count;
};

// A group of num_tables tables (data[t] from group row base[t]) as the
// launches that cover it, kMaxTablesPerLaunch tables each, in order.
inline std::vector<TableGroup> TableLaunches(int num_tables, const float* const* data,
                                             const int64_t* base) {
  std::vector<TableGroup> launches;
  for (int t0 = 0; t0 < num_tables; t0 += kMaxTablesPerLaunch) {
    TableGroup group{};
    group.count = num_tables - t0 < kMaxTablesPerLaunch ? num_tables - t0
                                                          : kMaxTablesPerLaunch;
    for (int k = 0; k < group.count; ++k) {
      group.data[k] = data[t0 + k];
      group.base[k] = base[t0 + k];
    }
    group.end = t0 + group.count < num_tables ? base[t0 + group.count] : INT64_MAX;
    launches.push_back(group);
  }
  return launches;
}

// out[i] = the row rows[i] of the group, for the rows inside `group`'s
// tables; callers check 0 <= rows[i] < total rows first (FindOutOfRange).
template <typename Index>
cudaError_t GatherFromTables(cudaStream_t stream, const TableGroup& group,
                             int64_t dim, const Index* rows, int64_t n, float* out);

// out[b] = sum over ids i of sample b of coefficient[i] * the row
// rows[inverse[i]] of the group, read straight from its table (the combine
// of GatherFromTables without the gathered rows). Rows outside `group`'s
// tables add nothing; with `accumulate` the sums are added to out, so a
// group of more than kMaxTablesPerLaunch tables takes one launch per
// kMaxTablesPerLaunch tables, the first writing and the rest adding.
// Callers check rows (FindOutOfRange against the group's end), inverse and
// splits first.
template <typename Index, typename Split>
cudaError_t CombineFromTables(cudaStream_t stream, const TableGroup& group, int64_t dim,
                              const Index* rows, const int32_t* inverse, const Split* splits,
                              int64_t batch, const float* coefficient, bool accumulate,
                              float* out);

// bag_of[i] = the sample of id i; coefficient[i] = w_i / divisor(sample),
// divisor 1 (sum), the sum of weights (mean) or the root of the sum of
// squared weights (sqrtn), and 0 for samples whose divisor is 0.
// weights == nullptr means every weight is 1.
template <typename Split>
cudaError_t CombineCoefficients(cudaStream_t stream, const Split* splits,
                                int64_t batch, const float* weights,
                                Combiner combiner, int32_t* bag_of,
                                float* coefficient);

// out[b] = sum over ids i of sample b of coefficient[i] * rows[inverse[i]];
// T is float, __half or __nv_bfloat16, accumulated in float.
template <typename T, typename Split>
cudaError_t EmbeddingCombine(cudaStream_t stream, const T* rows, int64_t dim,
                             const int32_t* inverse, const Split* splits,
                             int64_t batch, const float* coefficient, T* out);

// out[k] = sum over ids i with inverse[i] == k of coefficient[i] *
// grad[bag_of[i]]: in id order within chunks of 64 ids, then over the
// chunks, so hot rows are summed in parallel and results are deterministic.
template <typename T>
cudaError_t EmbeddingCombineGrad(cudaStream_t stream, const T* grad, int64_t dim,
                                 const int32_t* inverse, int64_t n,
                                 const int32_t* bag_of, const float* coefficient,
                                 int64_t num_unique, void* workspace,
                                 size_t* workspace_bytes, T* out);

// ---- Sparse optimizers ------------------------------------------------------
// Keras 3 formulas, as kernels/sparse_optimizer_ops.cc. vars[0] is the table,
// vars[1..] its slots, all [num_rows, dim]. grad_rows == nullptr means
// indices[i] takes grad row i. Callers check ranges and repeats first.

template <typename Index, typename Params>
cudaError_t SparseApply(cudaStream_t stream, const Params& params,
                        float* const* vars, int64_t dim, const Index* indices,
                        int64_t n, const float* grad, const int32_t* grad_rows);

}  // namespace gpu
}  // namespace tfde

#endif  // TFDE_KERNELS_CUDA_EMBEDDING_KERNELS_CU_H_
