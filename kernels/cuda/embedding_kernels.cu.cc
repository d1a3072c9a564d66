// CUDA implementations of the launchers in embedding_kernels.cu.h built on
// CUB's sorts: the checks for repeats, unique, partition and the combine's
// gradient (dense_kernels.cu.cc has the others).
//
// Sorting (CUB's stable radix sort) replaces the CPU kernels' hash maps:
// stability keeps every result in the same order as on the CPU (unique ids
// by first appearance, shards stable), so the GPU and CPU kernels agree and
// are checked against the same oracles.
#include "embedding_kernels.cu.h"
#include "launch_helpers.cu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include <cub/cub.cuh>

namespace tfde {
namespace gpu {
namespace {

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
    // hi = INT64_MAX bounds nothing, as on the CPU (device.h).
    const bool above = hi != INT64_MAX && v >= hi;
    if (v < lo || above) atomicMin(first_bad, static_cast<unsigned long long>(i));
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

// chunk_row[c] = the row whose chunks include chunk c, one thread per row:
// read once per chunk by ChunkSumsKernel, where a binary search per chunk
// and column cost more than the sums themselves.
__global__ void ChunkRows(const int32_t* chunk_offset, const int32_t* num_chunks,
                          int64_t num_unique, int32_t* chunk_row) {
  TFDE_GRID_STRIDE(k, num_unique) {
    for (int32_t c = chunk_offset[k]; c < chunk_offset[k] + num_chunks[k]; ++c) {
      chunk_row[c] = static_cast<int32_t>(k);
    }
  }
}

template <typename T>
__global__ void ChunkSumsKernel(const T* grad, int64_t dim, const int32_t* row_begin,
                                const int32_t* chunk_offset, const int32_t* num_chunks,
                                const int32_t* chunk_row, int64_t num_unique,
                                const int32_t* sorted_positions, const int32_t* bag_of,
                                const float* coefficient, int64_t max_chunks,
                                float* partial) {
  const int64_t total = chunk_offset[num_unique - 1] + num_chunks[num_unique - 1];
  TFDE_GRID_STRIDE(e, max_chunks * dim) {
    const int64_t c = e / dim;
    if (c >= total) continue;
    const int64_t d = e - c * dim;
    const int64_t row = chunk_row[c];
    const int64_t begin = row_begin[row] + (c - chunk_offset[row]) * kGradChunk;
    const int64_t end = min(begin + kGradChunk, static_cast<int64_t>(row_begin[row + 1]));
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
  int32_t* chunk_row = carve.Take<int32_t>(max_chunks);
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
  ChunkRows<<<BlocksFor(num_unique), kThreads, 0, stream>>>(chunk_offset, num_chunks,
                                                            num_unique, chunk_row);
  ChunkSumsKernel<<<BlocksFor(max_chunks * dim), kThreads, 0, stream>>>(
      grad, dim, row_begin, chunk_offset, num_chunks, chunk_row, num_unique, sorted_positions,
      bag_of, coefficient, max_chunks, partial);
  RowSumsKernel<<<BlocksFor(num_unique * dim), kThreads, 0, stream>>>(
      partial, dim, chunk_offset, num_chunks, num_unique, out);
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
  template cudaError_t FindBadSplit<Id>(cudaStream_t, const Id*, int64_t, int64_t,      \
                                        unsigned long long*);
TFDE_INSTANTIATE_ID(int32_t)
TFDE_INSTANTIATE_ID(int64_t)
#undef TFDE_INSTANTIATE_ID

#define TFDE_INSTANTIATE_ROWS(T)                                                        \
  template cudaError_t EmbeddingCombineGrad<T>(cudaStream_t, const T*, int64_t,         \
                                               const int32_t*, int64_t, const int32_t*, \
                                               const float*, int64_t, void*, size_t*, T*);
TFDE_INSTANTIATE_ROWS(float)
TFDE_INSTANTIATE_ROWS(__half)
TFDE_INSTANTIATE_ROWS(__nv_bfloat16)
#undef TFDE_INSTANTIATE_ROWS

}  // namespace gpu
}  // namespace tfde
