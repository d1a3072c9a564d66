// CUDA implementations of the launchers in embedding_kernels.cu.h.
//
// Sorting (CUB's stable radix sort) replaces the CPU kernels' hash maps:
// stability keeps every result in the same order as on the CPU (unique ids
// by first appearance, shards stable), so the GPU and CPU kernels agree and
// are checked against the same oracles.
#include "embedding_kernels.cu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include <cub/cub.cuh>

namespace tfde {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// Grid-stride loops: enough blocks to fill the device, never more than the
// grid limit.
inline int BlocksFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > (1 << 20) ? (1 << 20) : blocks));
}

#define TFDE_GRID_STRIDE(i, n)                                                  \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

#define TFDE_RETURN_IF_CUDA_ERROR(...)   \
  do {                                  \
    const cudaError_t _err = (__VA_ARGS__); \
    if (_err != cudaSuccess) return _err; \
  } while (0)

// Carves one workspace into aligned buffers; with base == nullptr it only
// measures.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t count) {
    used_ = (used_ + 255) & ~static_cast<size_t>(255);
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += static_cast<size_t>(count) * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

int BitsFor(int64_t max_value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= max_value) ++bits;
  return bits;
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
__device__ __forceinline__ int64_t LowerBound(const T* sorted, int64_t n, T value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sorted[mid] < value) lo = mid + 1; else hi = mid;
  }
  return lo;
}

__global__ void Iota(int32_t* out, int64_t n) {
  TFDE_GRID_STRIDE(i, n) out[i] = static_cast<int32_t>(i);
}

__global__ void SetNoError(unsigned long long* first_bad) { *first_bad = kNoError; }

template <typename T>
__global__ void OutOfRangeKernel(const T* values, int64_t n, int64_t lo, int64_t hi,
                                 unsigned long long* first_bad) {
  TFDE_GRID_STRIDE(i, n) {
    const int64_t v = static_cast<int64_t>(values[i]);
    if (v < lo || v >= hi) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

template <typename Split>
__global__ void BadSplitKernel(const Split* splits, int64_t batch, int64_t n,
                               unsigned long long* first_bad) {
  TFDE_GRID_STRIDE(b, batch + 1) {
    const bool bad = (b == 0 && splits[0] != 0) ||
                     (b > 0 && splits[b] < splits[b - 1]) ||
                     (b == batch && static_cast<int64_t>(splits[batch]) != n);
    if (bad) atomicMin(first_bad, static_cast<unsigned long long>(b));
  }
}

template <typename Index>
__global__ void RepeatKernel(const Index* sorted, const int32_t* sorted_positions,
                             int64_t n, unsigned long long* first_bad) {
  TFDE_GRID_STRIDE(j, n) {
    if (j > 0 && sorted[j] == sorted[j - 1]) {
      // The lowest repeating position is the second of its run, so its
      // predecessor in the sort is the first occurrence.
      const unsigned long long later = static_cast<unsigned long long>(sorted_positions[j]);
      const unsigned long long first = static_cast<unsigned long long>(sorted_positions[j - 1]);
      atomicMin(first_bad, (later << 32) | first);
    }
  }
}

// ---- unique ----

template <typename Id>
__global__ void MarkRunHeads(const Id* sorted_ids, const int32_t* sorted_positions,
                             int64_t n, int32_t* head, int32_t* is_first) {
  TFDE_GRID_STRIDE(j, n) {
    const int32_t h = (j == 0 || sorted_ids[j] != sorted_ids[j - 1]) ? 1 : 0;
    head[j] = h;
    // Stable sort: a run's head holds the id's first position.
    is_first[sorted_positions[j]] = h;
  }
}

__global__ void RecordRunStarts(const int32_t* head, const int32_t* run_id,
                                const int32_t* sorted_positions, int64_t n,
                                int32_t* run_start, int32_t* head_position) {
  TFDE_GRID_STRIDE(j, n) {
    if (head[j]) {
      const int32_t r = run_id[j] - 1;
      run_start[r] = static_cast<int32_t>(j);
      head_position[r] = sorted_positions[j];
    }
  }
}

template <typename Id>
__global__ void WriteUnique(const Id* sorted_ids, const int32_t* sorted_positions,
                            const int32_t* head, const int32_t* run_id,
                            const int32_t* run_start, const int32_t* head_position,
                            const int32_t* rank, int64_t n, Id* unique_ids,
                            int32_t* inverse, int32_t* counts, int32_t* num_unique) {
  const int32_t num_runs = run_id[n - 1];
  TFDE_GRID_STRIDE(j, n) {
    const int32_t r = run_id[j] - 1;
    const int32_t u = rank[head_position[r]];
    inverse[sorted_positions[j]] = u;
    if (head[j]) {
      unique_ids[u] = sorted_ids[j];
      const int64_t end = r + 1 < num_runs ? run_start[r + 1] : n;
      counts[u] = static_cast<int32_t>(end - j);
    }
    if (j == 0) *num_unique = num_runs;
  }
}

// ---- partition ----

template <typename Id>
__global__ void ShardKeys(const Id* ids, int64_t n, int32_t num_shards, int32_t* keys) {
  TFDE_GRID_STRIDE(i, n) {
    Id r = ids[i] % static_cast<Id>(num_shards);
    if (r < 0) r += static_cast<Id>(num_shards);  // floor modulo for dynamic keys
    keys[i] = static_cast<int32_t>(r);
  }
}

template <typename Id>
__global__ void ScatterByShard(const Id* ids, const int32_t* sorted_positions, int64_t n,
                               int32_t num_shards, bool dynamic, Id* local_ids,
                               int32_t* positions) {
  TFDE_GRID_STRIDE(j, n) {
    const int32_t p = sorted_positions[j];
    const Id id = ids[p];
    local_ids[j] = dynamic ? id : id / static_cast<Id>(num_shards);
    positions[p] = static_cast<int32_t>(j);
  }
}

__global__ void CountShards(const int32_t* sorted_keys, int64_t n, int32_t num_shards,
                            int32_t* counts) {
  TFDE_GRID_STRIDE(s, num_shards) {
    const int32_t shard = static_cast<int32_t>(s);
    counts[s] = static_cast<int32_t>(LowerBound(sorted_keys, n, shard + 1) -
                                     LowerBound(sorted_keys, n, shard));
  }
}

// ---- gather ----

template <typename Index>
__global__ void GatherKernel(const TableGroup group, int64_t dim, const Index* rows,
                             int64_t n, float* out) {
  TFDE_GRID_STRIDE(e, n * dim) {
    const int64_t i = e / dim;
    const int64_t d = e - i * dim;
    const int64_t r = static_cast<int64_t>(rows[i]);
    if (r < group.base[0] || r >= group.end) continue;
    int t = group.count - 1;
    while (group.base[t] > r) --t;
    out[e] = group.data[t][(r - group.base[t]) * dim + d];
  }
}

// ---- combine ----

template <typename Split>
__global__ void CoefficientsKernel(const Split* splits, int64_t batch, const float* weights,
                                   Combiner combiner, int32_t* bag_of, float* coefficient) {
  // One warp per sample.
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       b < batch; b += warps) {
    const int64_t begin = splits[b], end = splits[b + 1];
    double sum = 0.0, sum_sq = 0.0;
    for (int64_t i = begin + lane; i < end; i += 32) {
      const double w = weights ? weights[i] : 1.0;
      sum += w;
      sum_sq += w * w;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
      sum_sq += __shfl_down_sync(0xffffffffu, sum_sq, offset);
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    sum_sq = __shfl_sync(0xffffffffu, sum_sq, 0);
    double scale = 1.0;
    if (combiner == Combiner::kMean) {
      scale = sum == 0.0 ? 0.0 : 1.0 / sum;
    } else if (combiner == Combiner::kSqrtn) {
      scale = sum_sq == 0.0 ? 0.0 : 1.0 / sqrt(sum_sq);
    }
    for (int64_t i = begin + lane; i < end; i += 32) {
      coefficient[i] = static_cast<float>((weights ? weights[i] : 1.0) * scale);
      bag_of[i] = static_cast<int32_t>(b);
    }
  }
}

template <typename T, typename Split>
__global__ void CombineKernel(const T* rows, int64_t dim, const int32_t* inverse,
                              const Split* splits, int64_t batch, const float* coefficient,
                              T* out) {
  TFDE_GRID_STRIDE(e, batch * dim) {
    const int64_t b = e / dim;
    const int64_t d = e - b * dim;
    float acc = 0.0f;
    for (int64_t i = splits[b]; i < splits[b + 1]; ++i) {
      acc += coefficient[i] * ToFloat(rows[static_cast<int64_t>(inverse[i]) * dim + d]);
    }
    out[e] = FromFloat<T>(acc);
  }
}

__global__ void RowBegins(const int32_t* sorted_inverse, int64_t n, int64_t num_unique,
                          int32_t* row_begin) {
  TFDE_GRID_STRIDE(k, num_unique + 1) {
    row_begin[k] = k == num_unique
                       ? static_cast<int32_t>(n)
                       : static_cast<int32_t>(
                             LowerBound(sorted_inverse, n, static_cast<int32_t>(k)));
  }
}

// The gradient sums each unique row's ids in chunks of kGradChunk, so a hot
// row (Zipf: tens of thousands of ids) is summed by many threads; chunks
// and their partial sums have a fixed order, so results are deterministic.
constexpr int kGradChunk = 64;

__global__ void ChunksPerRow(const int32_t* row_begin, int64_t num_unique,
                             int32_t* num_chunks) {
  TFDE_GRID_STRIDE(k, num_unique) {
    num_chunks[k] = (row_begin[k + 1] - row_begin[k] + kGradChunk - 1) / kGradChunk;
  }
}

template <typename T>
__global__ void ChunkSumsKernel(const T* grad, int64_t dim, const int32_t* row_begin,
                                const int32_t* chunk_offset, const int32_t* num_chunks,
                                int64_t num_unique, const int32_t* sorted_positions,
                                const int32_t* bag_of, const float* coefficient,
                                int64_t max_chunks, float* partial) {
  const int64_t total = chunk_offset[num_unique - 1] + num_chunks[num_unique - 1];
  TFDE_GRID_STRIDE(e, max_chunks * dim) {
    const int64_t c = e / dim;
    if (c >= total) continue;
    const int64_t d = e - c * dim;
    // The row whose chunks include c: the last k with chunk_offset[k] <= c.
    int64_t lo = 0, hi = num_unique;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (chunk_offset[mid] <= c) lo = mid; else hi = mid;
    }
    const int64_t begin = row_begin[lo] + (c - chunk_offset[lo]) * kGradChunk;
    const int64_t end = min(begin + kGradChunk, static_cast<int64_t>(row_begin[lo + 1]));
    float acc = 0.0f;
    for (int64_t j = begin; j < end; ++j) {
      const int32_t i = sorted_positions[j];
      acc += coefficient[i] * ToFloat(grad[static_cast<int64_t>(bag_of[i]) * dim + d]);
    }
    partial[e] = acc;
  }
}

template <typename T>
__global__ void RowSumsKernel(const float* partial, int64_t dim, const int32_t* chunk_offset,
                              const int32_t* num_chunks, int64_t num_unique, T* out) {
  TFDE_GRID_STRIDE(e, num_unique * dim) {
    const int64_t k = e / dim;
    const int64_t d = e - k * dim;
    float acc = 0.0f;
    for (int32_t c = chunk_offset[k]; c < chunk_offset[k] + num_chunks[k]; ++c) {
      acc += partial[static_cast<int64_t>(c) * dim + d];
    }
    out[e] = FromFloat<T>(acc);
  }
}

// ---- optimizers ----

struct VarPointers {
  float* v[3];
};

__device__ __forceinline__ void ApplyElement(const SgdParams& p, const VarPointers&,
                                             int64_t at, float* w, float g) {
  w[at] -= p.lr * g;
}

__device__ __forceinline__ void ApplyElement(const AdagradParams& p, const VarPointers& vars,
                                             int64_t at, float* w, float g) {
  float* acc = vars.v[1];
  acc[at] += g * g;
  w[at] -= p.lr * g / sqrtf(acc[at] + p.epsilon);
}

__device__ __forceinline__ void ApplyElement(const LazyAdamParams& p, const VarPointers& vars,
                                             int64_t at, float* w, float g) {
  float* m = vars.v[1];
  float* v = vars.v[2];
  m[at] += (g - m[at]) * (1.0f - p.beta_1);
  v[at] += (g * g - v[at]) * (1.0f - p.beta_2);
  w[at] -= m[at] * p.alpha / (sqrtf(v[at]) + p.epsilon);
}

__device__ __forceinline__ void ApplyElement(const FtrlParams& p, const VarPointers& vars,
                                             int64_t at, float* w, float g) {
  float* acc = vars.v[1];
  float* linear = vars.v[2];
  const float grad_to_use = g + 2.0f * p.l2_shrinkage * w[at];
  const float new_acc = acc[at] + g * g;
  const float new_acc_pow = powf(new_acc, -p.lr_power);
  linear[at] += grad_to_use - (new_acc_pow - powf(acc[at], -p.lr_power)) / p.lr * w[at];
  const float quadratic = new_acc_pow / p.lr + 2.0f * p.l2_total;
  const float clipped = fminf(fmaxf(linear[at], -p.l1), p.l1);
  w[at] = (clipped - linear[at]) / quadratic;
  acc[at] = new_acc;
}

template <typename Index, typename Params>
__global__ void SparseApplyKernel(const Params params, const VarPointers vars, int64_t dim,
                                  const Index* indices, int64_t n, const float* grad,
                                  const int32_t* grad_rows) {
  TFDE_GRID_STRIDE(e, n * dim) {
    const int64_t i = e / dim;
    const int64_t d = e - i * dim;
    const int64_t g_row = grad_rows ? grad_rows[i] : i;
    ApplyElement(params, vars, static_cast<int64_t>(indices[i]) * dim + d, vars.v[0],
                 grad[g_row * dim + d]);
  }
}

}  // namespace

cudaError_t InitFirstBad(cudaStream_t stream, unsigned long long* first_bad) {
  SetNoError<<<1, 1, 0, stream>>>(first_bad);
  return cudaGetLastError();
}

template <typename T>
cudaError_t FindOutOfRange(cudaStream_t stream, const T* values, int64_t n, int64_t lo,
                           int64_t hi, unsigned long long* first_bad) {
  if (n == 0) return cudaSuccess;
  OutOfRangeKernel<<<BlocksFor(n), kThreads, 0, stream>>>(values, n, lo, hi, first_bad);
  return cudaGetLastError();
}

template <typename Split>
cudaError_t FindBadSplit(cudaStream_t stream, const Split* splits, int64_t batch, int64_t n,
                         unsigned long long* first_bad) {
  BadSplitKernel<<<BlocksFor(batch + 1), kThreads, 0, stream>>>(splits, batch, n, first_bad);
  return cudaGetLastError();
}

template <typename Index>
cudaError_t FindRepeatedIndex(cudaStream_t stream, const Index* indices, int64_t n,
                              void* workspace, size_t* workspace_bytes,
                              unsigned long long* first_bad) {
  const int num = static_cast<int>(n);
  size_t sort_bytes = 0;
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const Index*>(nullptr), static_cast<Index*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), num));
  Carver carve(workspace);
  Index* sorted = carve.Take<Index>(n);
  int32_t* positions = carve.Take<int32_t>(n);
  int32_t* sorted_positions = carve.Take<int32_t>(n);
  void* temp = carve.Take<char>(sort_bytes);
  if (workspace == nullptr) {
    *workspace_bytes = carve.used();
    return cudaSuccess;
  }
  if (n < 2) return cudaSuccess;
  Iota<<<BlocksFor(n), kThreads, 0, stream>>>(positions, n);
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
      temp, sort_bytes, indices, sorted, positions, sorted_positions, num, 0,
      static_cast<int>(sizeof(Index) * 8), stream));
  RepeatKernel<<<BlocksFor(n), kThreads, 0, stream>>>(sorted, sorted_positions, n, first_bad);
  return cudaGetLastError();
}

template <typename Id>
cudaError_t UniqueWithCounts(cudaStream_t stream, const Id* ids, int64_t n, void* workspace,
                             size_t* workspace_bytes, Id* unique_ids, int32_t* inverse,
                             int32_t* counts, int32_t* num_unique) {
  const int num = static_cast<int>(n);
  size_t sort_bytes = 0, scan_bytes = 0;
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const Id*>(nullptr), static_cast<Id*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), num));
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceScan::InclusiveSum(
      nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), num));
  size_t exclusive_bytes = 0;
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceScan::ExclusiveSum(
      nullptr, exclusive_bytes, static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), num));
  const size_t temp_bytes = std::max(sort_bytes, std::max(scan_bytes, exclusive_bytes));
  Carver carve(workspace);
  Id* sorted_ids = carve.Take<Id>(n);
  int32_t* positions = carve.Take<int32_t>(n);
  int32_t* sorted_positions = carve.Take<int32_t>(n);
  int32_t* head = carve.Take<int32_t>(n);
  int32_t* is_first = carve.Take<int32_t>(n);
  int32_t* run_id = carve.Take<int32_t>(n);
  int32_t* rank = carve.Take<int32_t>(n);
  int32_t* run_start = carve.Take<int32_t>(n);
  int32_t* head_position = carve.Take<int32_t>(n);
  void* temp = carve.Take<char>(temp_bytes);
  if (workspace == nullptr) {
    *workspace_bytes = carve.used();
    return cudaSuccess;
  }
  if (n == 0) return cudaMemsetAsync(num_unique, 0, sizeof(int32_t), stream);
  const int blocks = BlocksFor(n);
  Iota<<<blocks, kThreads, 0, stream>>>(positions, n);
  size_t bytes = temp_bytes;
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
      temp, bytes, ids, sorted_ids, positions, sorted_positions, num, 0,
      static_cast<int>(sizeof(Id) * 8), stream));
  MarkRunHeads<<<blocks, kThreads, 0, stream>>>(sorted_ids, sorted_positions, n, head,
                                                is_first);
  bytes = temp_bytes;
  TFDE_RETURN_IF_CUDA_ERROR(
      cub::DeviceScan::InclusiveSum(temp, bytes, head, run_id, num, stream));
  bytes = temp_bytes;
  TFDE_RETURN_IF_CUDA_ERROR(
      cub::DeviceScan::ExclusiveSum(temp, bytes, is_first, rank, num, stream));
  RecordRunStarts<<<blocks, kThreads, 0, stream>>>(head, run_id, sorted_positions, n,
                                                   run_start, head_position);
  WriteUnique<<<blocks, kThreads, 0, stream>>>(sorted_ids, sorted_positions, head, run_id,
                                               run_start, head_position, rank, n,
                                               unique_ids, inverse, counts, num_unique);
  return cudaGetLastError();
}

template <typename Id>
cudaError_t PartitionByShard(cudaStream_t stream, const Id* ids, int64_t n,
                             int32_t num_shards, bool dynamic, void* workspace,
                             size_t* workspace_bytes, Id* local_ids, int32_t* shard_counts,
                             int32_t* positions) {
  const int num = static_cast<int>(n);
  size_t sort_bytes = 0;
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), num));
  Carver carve(workspace);
  int32_t* keys = carve.Take<int32_t>(n);
  int32_t* sorted_keys = carve.Take<int32_t>(n);
  int32_t* order = carve.Take<int32_t>(n);
  int32_t* sorted_order = carve.Take<int32_t>(n);
  void* temp = carve.Take<char>(sort_bytes);
  if (workspace == nullptr) {
    *workspace_bytes = carve.used();
    return cudaSuccess;
  }
  if (n > 0) {
    const int blocks = BlocksFor(n);
    ShardKeys<<<blocks, kThreads, 0, stream>>>(ids, n, num_shards, keys);
    Iota<<<blocks, kThreads, 0, stream>>>(order, n);
    TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
        temp, sort_bytes, keys, sorted_keys, order, sorted_order, num, 0,
        BitsFor(num_shards - 1), stream));
    ScatterByShard<<<blocks, kThreads, 0, stream>>>(ids, sorted_order, n, num_shards,
                                                    dynamic, local_ids, positions);
  }
  CountShards<<<BlocksFor(num_shards), kThreads, 0, stream>>>(sorted_keys, n, num_shards,
                                                              shard_counts);
  return cudaGetLastError();
}

template <typename Index>
cudaError_t GatherFromTables(cudaStream_t stream, const TableGroup& group, int64_t dim,
                             const Index* rows, int64_t n, float* out) {
  if (n == 0 || dim == 0) return cudaSuccess;
  GatherKernel<<<BlocksFor(n * dim), kThreads, 0, stream>>>(group, dim, rows, n, out);
  return cudaGetLastError();
}

template <typename Split>
cudaError_t CombineCoefficients(cudaStream_t stream, const Split* splits, int64_t batch,
                                const float* weights, Combiner combiner, int32_t* bag_of,
                                float* coefficient) {
  if (batch == 0) return cudaSuccess;
  CoefficientsKernel<<<BlocksFor(batch * 32), kThreads, 0, stream>>>(
      splits, batch, weights, combiner, bag_of, coefficient);
  return cudaGetLastError();
}

template <typename T, typename Split>
cudaError_t EmbeddingCombine(cudaStream_t stream, const T* rows, int64_t dim,
                             const int32_t* inverse, const Split* splits, int64_t batch,
                             const float* coefficient, T* out) {
  if (batch == 0 || dim == 0) return cudaSuccess;
  CombineKernel<<<BlocksFor(batch * dim), kThreads, 0, stream>>>(
      rows, dim, inverse, splits, batch, coefficient, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t EmbeddingCombineGrad(cudaStream_t stream, const T* grad, int64_t dim,
                                 const int32_t* inverse, int64_t n, const int32_t* bag_of,
                                 const float* coefficient, int64_t num_unique,
                                 void* workspace, size_t* workspace_bytes, T* out) {
  const int num = static_cast<int>(n);
  // Every row has at least one id, so chunks number at most n / C + rows.
  const int64_t max_chunks = n / kGradChunk + num_unique;
  size_t sort_bytes = 0, scan_bytes = 0;
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), num));
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceScan::ExclusiveSum(
      nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int>(num_unique)));
  Carver carve(workspace);
  int32_t* sorted_inverse = carve.Take<int32_t>(n);
  int32_t* positions = carve.Take<int32_t>(n);
  int32_t* sorted_positions = carve.Take<int32_t>(n);
  int32_t* row_begin = carve.Take<int32_t>(num_unique + 1);
  int32_t* num_chunks = carve.Take<int32_t>(num_unique);
  int32_t* chunk_offset = carve.Take<int32_t>(num_unique);
  float* partial = carve.Take<float>(max_chunks * dim);
  void* temp = carve.Take<char>(std::max(sort_bytes, scan_bytes));
  if (workspace == nullptr) {
    *workspace_bytes = carve.used();
    return cudaSuccess;
  }
  if (num_unique == 0 || dim == 0) return cudaSuccess;
  if (n > 0) {
    Iota<<<BlocksFor(n), kThreads, 0, stream>>>(positions, n);
    TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
        temp, sort_bytes, inverse, sorted_inverse, positions, sorted_positions, num, 0,
        BitsFor(num_unique - 1), stream));
  }
  RowBegins<<<BlocksFor(num_unique + 1), kThreads, 0, stream>>>(sorted_inverse, n,
                                                                num_unique, row_begin);
  ChunksPerRow<<<BlocksFor(num_unique), kThreads, 0, stream>>>(row_begin, num_unique,
                                                               num_chunks);
  TFDE_RETURN_IF_CUDA_ERROR(cub::DeviceScan::ExclusiveSum(
      temp, scan_bytes, num_chunks, chunk_offset, static_cast<int>(num_unique), stream));
  ChunkSumsKernel<<<BlocksFor(max_chunks * dim), kThreads, 0, stream>>>(
      grad, dim, row_begin, chunk_offset, num_chunks, num_unique, sorted_positions, bag_of,
      coefficient, max_chunks, partial);
  RowSumsKernel<<<BlocksFor(num_unique * dim), kThreads, 0, stream>>>(
      partial, dim, chunk_offset, num_chunks, num_unique, out);
  return cudaGetLastError();
}

template <typename Index, typename Params>
cudaError_t SparseApply(cudaStream_t stream, const Params& params, float* const* vars,
                        int64_t dim, const Index* indices, int64_t n, const float* grad,
                        const int32_t* grad_rows) {
  if (n == 0 || dim == 0) return cudaSuccess;
  VarPointers pointers{{vars[0], nullptr, nullptr}};
  constexpr int kSlots = std::is_same<Params, SgdParams>::value       ? 0
                         : std::is_same<Params, AdagradParams>::value ? 1
                                                                      : 2;
  for (int s = 1; s <= kSlots; ++s) pointers.v[s] = vars[s];
  SparseApplyKernel<Index, Params><<<BlocksFor(n * dim), kThreads, 0, stream>>>(
      params, pointers, dim, indices, n, grad, grad_rows);
  return cudaGetLastError();
}

#define TFDE_INSTANTIATE_ID(Id)                                                         \
  template cudaError_t FindOutOfRange<Id>(cudaStream_t, const Id*, int64_t, int64_t,    \
                                          int64_t, unsigned long long*);                \
  template cudaError_t FindRepeatedIndex<Id>(cudaStream_t, const Id*, int64_t, void*,   \
                                             size_t*, unsigned long long*);             \
  template cudaError_t UniqueWithCounts<Id>(cudaStream_t, const Id*, int64_t, void*,    \
                                            size_t*, Id*, int32_t*, int32_t*, int32_t*); \
  template cudaError_t PartitionByShard<Id>(cudaStream_t, const Id*, int64_t, int32_t,  \
                                            bool, void*, size_t*, Id*, int32_t*,        \
                                            int32_t*);                                  \
  template cudaError_t GatherFromTables<Id>(cudaStream_t, const TableGroup&, int64_t,   \
                                            const Id*, int64_t, float*);                \
  template cudaError_t FindBadSplit<Id>(cudaStream_t, const Id*, int64_t, int64_t,      \
                                        unsigned long long*);                           \
  template cudaError_t CombineCoefficients<Id>(cudaStream_t, const Id*, int64_t,        \
                                               const float*, Combiner, int32_t*,        \
                                               float*);                                 \
  template cudaError_t SparseApply<Id, SgdParams>(cudaStream_t, const SgdParams&,       \
                                                  float* const*, int64_t, const Id*,    \
                                                  int64_t, const float*, const int32_t*); \
  template cudaError_t SparseApply<Id, AdagradParams>(                                  \
      cudaStream_t, const AdagradParams&, float* const*, int64_t, const Id*, int64_t,   \
      const float*, const int32_t*);                                                    \
  template cudaError_t SparseApply<Id, LazyAdamParams>(                                 \
      cudaStream_t, const LazyAdamParams&, float* const*, int64_t, const Id*, int64_t,  \
      const float*, const int32_t*);                                                    \
  template cudaError_t SparseApply<Id, FtrlParams>(cudaStream_t, const FtrlParams&,     \
                                                   float* const*, int64_t, const Id*,   \
                                                   int64_t, const float*, const int32_t*);
TFDE_INSTANTIATE_ID(int32_t)
TFDE_INSTANTIATE_ID(int64_t)
#undef TFDE_INSTANTIATE_ID

#define TFDE_INSTANTIATE_ROWS(T)                                                        \
  template cudaError_t EmbeddingCombine<T, int32_t>(cudaStream_t, const T*, int64_t,    \
                                                    const int32_t*, const int32_t*,     \
                                                    int64_t, const float*, T*);         \
  template cudaError_t EmbeddingCombine<T, int64_t>(cudaStream_t, const T*, int64_t,    \
                                                    const int32_t*, const int64_t*,     \
                                                    int64_t, const float*, T*);         \
  template cudaError_t EmbeddingCombineGrad<T>(cudaStream_t, const T*, int64_t,         \
                                               const int32_t*, int64_t, const int32_t*, \
                                               const float*, int64_t, void*, size_t*, T*);
TFDE_INSTANTIATE_ROWS(float)
TFDE_INSTANTIATE_ROWS(__half)
TFDE_INSTANTIATE_ROWS(__nv_bfloat16)
#undef TFDE_INSTANTIATE_ROWS

}  // namespace gpu
}  // namespace tfde
