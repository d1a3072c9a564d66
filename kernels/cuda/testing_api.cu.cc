// A C API over host arrays for testing the CUDA launchers without a
// CUDA-enabled TensorFlow: tests/test_cuda_kernels.py loads it with ctypes
// and compares every result with the numpy oracles. Each call copies its
// inputs to the device, runs the same check-then-launch sequence as the TF
// GPU functors (gpu_functors.cc), copies results back and synchronizes.
//
// Returns 0, or the CUDA error code. A failed input check is not an error
// of the call: it comes back in a `first_bad` argument (kNoError if none),
// and then nothing is written, as in the op kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "embedding_kernels.cu.h"

namespace tfde {
namespace gpu {
namespace {

// A device buffer freed at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  cudaError_t Allocate(size_t bytes) {
    return cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes);
  }
  cudaError_t Upload(const void* host, size_t bytes) {
    cudaError_t err = Allocate(bytes);
    if (err != cudaSuccess || bytes == 0) return err;
    return cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice);
  }
  cudaError_t Download(void* host, size_t bytes) const {
    return bytes == 0 ? cudaSuccess : cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost);
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Variadic: template arguments in the expression contain commas.
#define TFDE_CHECK_CUDA(...)                       \
  do {                                             \
    const cudaError_t _err = (__VA_ARGS__);        \
    if (_err != cudaSuccess) return static_cast<int>(_err); \
  } while (0)

// Runs a check writing first_bad and returns its value on the host.
class FirstBad {
 public:
  cudaError_t Init() {
    cudaError_t err = buffer_.Allocate(sizeof(unsigned long long));
    return err != cudaSuccess ? err : InitFirstBad(0, buffer_.as<unsigned long long>());
  }
  unsigned long long* device() const { return buffer_.as<unsigned long long>(); }
  cudaError_t Read(unsigned long long* host) const {
    return buffer_.Download(host, sizeof(unsigned long long));
  }

 private:
  DeviceBuffer buffer_;
};

template <typename Launch>
cudaError_t WithWorkspace(Launch launch, DeviceBuffer* workspace) {
  size_t bytes = 0;
  cudaError_t err = launch(nullptr, &bytes);
  if (err != cudaSuccess) return err;
  err = workspace->Allocate(bytes);
  if (err != cudaSuccess) return err;
  return launch(workspace->as<void>(), &bytes);
}

template <typename Id>
int Unique(const void* ids_host, int64_t n, void* unique_host, int32_t* inverse_host,
           int32_t* counts_host, int32_t* num_unique_host) {
  DeviceBuffer ids, unique, inverse, counts, num_unique, workspace;
  TFDE_CHECK_CUDA(ids.Upload(ids_host, n * sizeof(Id)));
  TFDE_CHECK_CUDA(unique.Allocate(n * sizeof(Id)));
  TFDE_CHECK_CUDA(inverse.Allocate(n * sizeof(int32_t)));
  TFDE_CHECK_CUDA(counts.Allocate(n * sizeof(int32_t)));
  TFDE_CHECK_CUDA(num_unique.Allocate(sizeof(int32_t)));
  TFDE_CHECK_CUDA(WithWorkspace(
      [&](void* ws, size_t* bytes) {
        return UniqueWithCounts<Id>(0, ids.as<Id>(), n, ws, bytes, unique.as<Id>(),
                                    inverse.as<int32_t>(), counts.as<int32_t>(),
                                    num_unique.as<int32_t>());
      },
      &workspace));
  TFDE_CHECK_CUDA(num_unique.Download(num_unique_host, sizeof(int32_t)));
  TFDE_CHECK_CUDA(unique.Download(unique_host, *num_unique_host * sizeof(Id)));
  TFDE_CHECK_CUDA(counts.Download(counts_host, *num_unique_host * sizeof(int32_t)));
  TFDE_CHECK_CUDA(inverse.Download(inverse_host, n * sizeof(int32_t)));
  return 0;
}

template <typename Id>
int Partition(const void* ids_host, int64_t n, int32_t num_shards, int dynamic,
              void* local_host, int32_t* counts_host, int32_t* positions_host,
              unsigned long long* first_negative) {
  DeviceBuffer ids, local, counts, positions, workspace;
  FirstBad bad;
  TFDE_CHECK_CUDA(ids.Upload(ids_host, n * sizeof(Id)));
  TFDE_CHECK_CUDA(bad.Init());
  if (!dynamic) {
    // Static tables have rows 0..V-1: negative ids are errors, not keys.
    TFDE_CHECK_CUDA(FindOutOfRange<Id>(0, ids.as<Id>(), n, 0, INT64_MAX, bad.device()));
  }
  TFDE_CHECK_CUDA(bad.Read(first_negative));
  if (*first_negative != kNoError) return 0;
  TFDE_CHECK_CUDA(local.Allocate(n * sizeof(Id)));
  TFDE_CHECK_CUDA(counts.Allocate(num_shards * sizeof(int32_t)));
  TFDE_CHECK_CUDA(positions.Allocate(n * sizeof(int32_t)));
  TFDE_CHECK_CUDA(WithWorkspace(
      [&](void* ws, size_t* bytes) {
        return PartitionByShard<Id>(0, ids.as<Id>(), n, num_shards, dynamic != 0, ws, bytes,
                                    local.as<Id>(), counts.as<int32_t>(),
                                    positions.as<int32_t>());
      },
      &workspace));
  TFDE_CHECK_CUDA(local.Download(local_host, n * sizeof(Id)));
  TFDE_CHECK_CUDA(counts.Download(counts_host, num_shards * sizeof(int32_t)));
  TFDE_CHECK_CUDA(positions.Download(positions_host, n * sizeof(int32_t)));
  return 0;
}

// A combine's checked batch and coefficients on the device, shared by the
// combines and the gradient: Prepare returns 0 or a CUDA error, and leaves
// `ready` false when a check failed (first_bad_split / first_bad_inverse
// say which; then nothing else is uploaded or computed).
struct PreparedCombine {
  DeviceBuffer inverse, splits, weights, bag_of, coefficient;
  bool ready = false;

  template <typename Split>
  int Prepare(const int32_t* inverse_host, int64_t n, int64_t num_rows,
              const void* splits_host, int64_t batch, const float* weights_host,
              int combiner, unsigned long long* first_bad_split,
              unsigned long long* first_bad_inverse) {
    FirstBad split_check, inverse_check;
    TFDE_CHECK_CUDA(inverse.Upload(inverse_host, n * sizeof(int32_t)));
    TFDE_CHECK_CUDA(splits.Upload(splits_host, (batch + 1) * sizeof(Split)));
    if (weights_host) TFDE_CHECK_CUDA(weights.Upload(weights_host, n * sizeof(float)));
    TFDE_CHECK_CUDA(split_check.Init());
    TFDE_CHECK_CUDA(inverse_check.Init());
    TFDE_CHECK_CUDA(FindBadSplit<Split>(0, splits.as<Split>(), batch, n, split_check.device()));
    TFDE_CHECK_CUDA(FindOutOfRange<int32_t>(0, inverse.as<int32_t>(), n, 0, num_rows,
                                            inverse_check.device()));
    TFDE_CHECK_CUDA(split_check.Read(first_bad_split));
    TFDE_CHECK_CUDA(inverse_check.Read(first_bad_inverse));
    if (*first_bad_split != kNoError || *first_bad_inverse != kNoError) return 0;
    TFDE_CHECK_CUDA(bag_of.Allocate(n * sizeof(int32_t)));
    TFDE_CHECK_CUDA(coefficient.Allocate(n * sizeof(float)));
    TFDE_CHECK_CUDA(CombineCoefficients<Split>(
        0, splits.as<Split>(), batch, weights_host ? weights.as<float>() : nullptr,
        static_cast<Combiner>(combiner), bag_of.as<int32_t>(), coefficient.as<float>()));
    ready = true;
    return 0;
  }
};

template <typename T, typename Split>
int Combine(const void* rows_host, int64_t num_rows, int64_t dim, const int32_t* inverse_host,
            int64_t n, const void* splits_host, int64_t batch, const float* weights_host,
            int combiner, void* out_host, unsigned long long* first_bad_split,
            unsigned long long* first_bad_inverse) {
  PreparedCombine c;
  const int status = c.Prepare<Split>(inverse_host, n, num_rows, splits_host, batch,
                                      weights_host, combiner, first_bad_split, first_bad_inverse);
  if (status != 0 || !c.ready) return status;
  DeviceBuffer rows, out;
  TFDE_CHECK_CUDA(rows.Upload(rows_host, num_rows * dim * sizeof(T)));
  TFDE_CHECK_CUDA(out.Allocate(batch * dim * sizeof(T)));
  TFDE_CHECK_CUDA(EmbeddingCombine<T, Split>(0, rows.as<T>(), dim, c.inverse.as<int32_t>(),
                                             c.splits.as<Split>(), batch,
                                             c.coefficient.as<float>(), out.as<T>()));
  TFDE_CHECK_CUDA(out.Download(out_host, batch * dim * sizeof(T)));
  return 0;
}

template <typename T, typename Split>
int CombineGrad(const void* grad_host, int64_t dim, const int32_t* inverse_host, int64_t n,
                const void* splits_host, int64_t batch, const float* weights_host,
                int combiner, int64_t num_unique, void* out_host,
                unsigned long long* first_bad_split, unsigned long long* first_bad_inverse) {
  PreparedCombine c;
  const int status = c.Prepare<Split>(inverse_host, n, num_unique, splits_host, batch,
                                      weights_host, combiner, first_bad_split, first_bad_inverse);
  if (status != 0 || !c.ready) return status;
  DeviceBuffer grad, out, workspace;
  TFDE_CHECK_CUDA(grad.Upload(grad_host, batch * dim * sizeof(T)));
  TFDE_CHECK_CUDA(out.Allocate(num_unique * dim * sizeof(T)));
  TFDE_CHECK_CUDA(WithWorkspace(
      [&](void* ws, size_t* bytes) {
        return EmbeddingCombineGrad<T>(0, grad.as<T>(), dim, c.inverse.as<int32_t>(), n,
                                       c.bag_of.as<int32_t>(), c.coefficient.as<float>(),
                                       num_unique, ws, bytes, out.as<T>());
      },
      &workspace));
  TFDE_CHECK_CUDA(out.Download(out_host, num_unique * dim * sizeof(T)));
  return 0;
}

// The group's tables uploaded, with their bases (base[num_tables]: the
// group's end), and one launch group per kMaxTablesPerLaunch tables.
class UploadedTables {
 public:
  cudaError_t Upload(int num_tables, const float* const* tables_host,
                     const int64_t* table_rows, int64_t dim) {
    tables_ = std::vector<DeviceBuffer>(num_tables);
    base_.assign(num_tables + 1, 0);
    for (int t = 0; t < num_tables; ++t) {
      cudaError_t err = tables_[t].Upload(tables_host[t], table_rows[t] * dim * sizeof(float));
      if (err != cudaSuccess) return err;
      base_[t + 1] = base_[t] + table_rows[t];
    }
    return cudaSuccess;
  }
  int64_t end() const { return base_.back(); }
  std::vector<TableGroup> Launches() const {
    std::vector<const float*> data;
    for (const DeviceBuffer& table : tables_) data.push_back(table.as<float>());
    return TableLaunches(static_cast<int>(tables_.size()), data.data(), base_.data());
  }

 private:
  std::vector<DeviceBuffer> tables_;
  std::vector<int64_t> base_;
};

template <typename Index>
int Gather(int num_tables, const float* const* tables_host, const int64_t* table_rows,
           int64_t dim, const void* rows_host, int64_t n, float* out_host,
           unsigned long long* first_bad) {
  UploadedTables tables;
  DeviceBuffer rows, out;
  FirstBad bad;
  TFDE_CHECK_CUDA(tables.Upload(num_tables, tables_host, table_rows, dim));
  TFDE_CHECK_CUDA(rows.Upload(rows_host, n * sizeof(Index)));
  TFDE_CHECK_CUDA(bad.Init());
  TFDE_CHECK_CUDA(FindOutOfRange<Index>(0, rows.as<Index>(), n, 0, tables.end(), bad.device()));
  TFDE_CHECK_CUDA(bad.Read(first_bad));
  if (*first_bad != kNoError) return 0;
  TFDE_CHECK_CUDA(out.Allocate(n * dim * sizeof(float)));
  for (const TableGroup& group : tables.Launches()) {
    TFDE_CHECK_CUDA(GatherFromTables<Index>(0, group, dim, rows.as<Index>(), n, out.as<float>()));
  }
  TFDE_CHECK_CUDA(out.Download(out_host, n * dim * sizeof(float)));
  return 0;
}

template <typename Index, typename Split>
int CombineFromTablesHost(int num_tables, const float* const* tables_host,
                          const int64_t* table_rows, int64_t dim, const void* rows_host,
                          int64_t num_rows, const int32_t* inverse_host, int64_t n,
                          const void* splits_host, int64_t batch, const float* weights_host,
                          int combiner, float* out_host, unsigned long long* first_bad_row,
                          unsigned long long* first_bad_split,
                          unsigned long long* first_bad_inverse) {
  PreparedCombine c;
  const int status = c.Prepare<Split>(inverse_host, n, num_rows, splits_host, batch,
                                      weights_host, combiner, first_bad_split, first_bad_inverse);
  if (status != 0 || !c.ready) return status;
  DeviceBuffer rows, out;
  UploadedTables tables;
  FirstBad bad;
  TFDE_CHECK_CUDA(tables.Upload(num_tables, tables_host, table_rows, dim));
  TFDE_CHECK_CUDA(rows.Upload(rows_host, num_rows * sizeof(Index)));
  TFDE_CHECK_CUDA(bad.Init());
  TFDE_CHECK_CUDA(
      FindOutOfRange<Index>(0, rows.as<Index>(), num_rows, 0, tables.end(), bad.device()));
  TFDE_CHECK_CUDA(bad.Read(first_bad_row));
  if (*first_bad_row != kNoError) return 0;
  TFDE_CHECK_CUDA(out.Allocate(batch * dim * sizeof(float)));
  bool first = true;
  for (const TableGroup& group : tables.Launches()) {
    TFDE_CHECK_CUDA(CombineFromTables<Index, Split>(
        0, group, dim, rows.as<Index>(), c.inverse.as<int32_t>(), c.splits.as<Split>(), batch,
        c.coefficient.as<float>(), /*accumulate=*/!first, out.as<float>()));
    first = false;
  }
  TFDE_CHECK_CUDA(out.Download(out_host, batch * dim * sizeof(float)));
  return 0;
}

template <typename Index>
int Apply(int kind, const float* hyper, int num_vars, float* const* vars_host,
          int64_t num_rows, int64_t dim, const void* indices_host, int64_t n,
          const float* grad_host, int64_t grad_num_rows, const int32_t* grad_rows_host,
          unsigned long long* first_out_of_range, unsigned long long* first_repeat) {
  DeviceBuffer indices, grad, grad_rows, workspace;
  std::vector<DeviceBuffer> vars(num_vars);
  FirstBad range_check, repeat_check;
  TFDE_CHECK_CUDA(indices.Upload(indices_host, n * sizeof(Index)));
  TFDE_CHECK_CUDA(range_check.Init());
  TFDE_CHECK_CUDA(repeat_check.Init());
  TFDE_CHECK_CUDA(FindOutOfRange<Index>(0, indices.as<Index>(), n, 0, num_rows,
                                        range_check.device()));
  TFDE_CHECK_CUDA(WithWorkspace(
      [&](void* ws, size_t* bytes) {
        return FindRepeatedIndex<Index>(0, indices.as<Index>(), n, ws, bytes,
                                        repeat_check.device());
      },
      &workspace));
  TFDE_CHECK_CUDA(range_check.Read(first_out_of_range));
  TFDE_CHECK_CUDA(repeat_check.Read(first_repeat));
  if (*first_out_of_range != kNoError || *first_repeat != kNoError) return 0;
  float* var_ptrs[3] = {nullptr, nullptr, nullptr};
  for (int v = 0; v < num_vars; ++v) {
    TFDE_CHECK_CUDA(vars[v].Upload(vars_host[v], num_rows * dim * sizeof(float)));
    var_ptrs[v] = vars[v].as<float>();
  }
  TFDE_CHECK_CUDA(grad.Upload(grad_host, grad_num_rows * dim * sizeof(float)));
  const int32_t* grad_rows_device = nullptr;
  if (grad_rows_host) {
    TFDE_CHECK_CUDA(grad_rows.Upload(grad_rows_host, n * sizeof(int32_t)));
    grad_rows_device = grad_rows.as<int32_t>();
  }
  const Index* idx = indices.as<Index>();
  const float* g = grad.as<float>();
  switch (kind) {
    case 0:
      TFDE_CHECK_CUDA(SparseApply<Index>(0, SgdParams{hyper[0]}, var_ptrs, dim, idx, n, g,
                                         grad_rows_device));
      break;
    case 1:
      TFDE_CHECK_CUDA(SparseApply<Index>(0, AdagradParams{hyper[0], hyper[1]}, var_ptrs,
                                         dim, idx, n, g, grad_rows_device));
      break;
    case 2:
      TFDE_CHECK_CUDA(SparseApply<Index>(
          0, MakeLazyAdamParams(hyper[0], hyper[1], hyper[2], hyper[3], hyper[4]), var_ptrs,
          dim, idx, n, g, grad_rows_device));
      break;
    case 3:
      TFDE_CHECK_CUDA(SparseApply<Index>(
          0, MakeFtrlParams(hyper[0], hyper[1], hyper[2], hyper[3], hyper[4], hyper[5]),
          var_ptrs, dim, idx, n, g, grad_rows_device));
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  for (int v = 0; v < num_vars; ++v) {
    TFDE_CHECK_CUDA(vars[v].Download(vars_host[v], num_rows * dim * sizeof(float)));
  }
  return 0;
}

}  // namespace
}  // namespace gpu
}  // namespace tfde

using namespace tfde::gpu;  // NOLINT: a thin C shim over one namespace

extern "C" {

unsigned long long tfde_gpu_no_error() { return kNoError; }

int tfde_gpu_unique_with_counts(int id_bytes, const void* ids, int64_t n, void* unique_ids,
                                int32_t* inverse, int32_t* counts, int32_t* num_unique) {
  return id_bytes == 8 ? Unique<int64_t>(ids, n, unique_ids, inverse, counts, num_unique)
                       : Unique<int32_t>(ids, n, unique_ids, inverse, counts, num_unique);
}

int tfde_gpu_partition_by_shard(int id_bytes, const void* ids, int64_t n, int32_t num_shards,
                                int dynamic, void* local_ids, int32_t* shard_counts,
                                int32_t* positions, unsigned long long* first_negative) {
  return id_bytes == 8 ? Partition<int64_t>(ids, n, num_shards, dynamic, local_ids,
                                            shard_counts, positions, first_negative)
                       : Partition<int32_t>(ids, n, num_shards, dynamic, local_ids,
                                            shard_counts, positions, first_negative);
}

// row_type: 0 float32, 1 float16, 2 bfloat16.
int tfde_gpu_embedding_combine(int row_type, int split_bytes, const void* rows,
                               int64_t num_rows, int64_t dim, const int32_t* inverse,
                               int64_t n, const void* splits, int64_t batch,
                               const float* weights, int combiner, void* out,
                               unsigned long long* first_bad_split,
                               unsigned long long* first_bad_inverse) {
#define TFDE_COMBINE(T, Split)                                                             \
  return Combine<T, Split>(rows, num_rows, dim, inverse, n, splits, batch, weights,      \
                           combiner, out, first_bad_split, first_bad_inverse)
  if (split_bytes == 8) {
    if (row_type == 1) TFDE_COMBINE(__half, int64_t);
    if (row_type == 2) TFDE_COMBINE(__nv_bfloat16, int64_t);
    TFDE_COMBINE(float, int64_t);
  }
  if (row_type == 1) TFDE_COMBINE(__half, int32_t);
  if (row_type == 2) TFDE_COMBINE(__nv_bfloat16, int32_t);
  TFDE_COMBINE(float, int32_t);
#undef TFDE_COMBINE
}

int tfde_gpu_embedding_combine_grad(int row_type, int split_bytes, const void* grad,
                                    int64_t dim, const int32_t* inverse, int64_t n,
                                    const void* splits, int64_t batch, const float* weights,
                                    int combiner, int64_t num_unique, void* out,
                                    unsigned long long* first_bad_split,
                                    unsigned long long* first_bad_inverse) {
#define TFDE_COMBINE_GRAD(T, Split)                                                  \
  return CombineGrad<T, Split>(grad, dim, inverse, n, splits, batch, weights, combiner, \
                               num_unique, out, first_bad_split, first_bad_inverse)
  if (split_bytes == 8) {
    if (row_type == 1) TFDE_COMBINE_GRAD(__half, int64_t);
    if (row_type == 2) TFDE_COMBINE_GRAD(__nv_bfloat16, int64_t);
    TFDE_COMBINE_GRAD(float, int64_t);
  }
  if (row_type == 1) TFDE_COMBINE_GRAD(__half, int32_t);
  if (row_type == 2) TFDE_COMBINE_GRAD(__nv_bfloat16, int32_t);
  TFDE_COMBINE_GRAD(float, int32_t);
#undef TFDE_COMBINE_GRAD
}

int tfde_gpu_gather_from_tables(int index_bytes, int num_tables, const float* const* tables,
                                const int64_t* table_rows, int64_t dim, const void* rows,
                                int64_t n, float* out, unsigned long long* first_bad) {
  return index_bytes == 8
             ? Gather<int64_t>(num_tables, tables, table_rows, dim, rows, n, out, first_bad)
             : Gather<int32_t>(num_tables, tables, table_rows, dim, rows, n, out, first_bad);
}

int tfde_gpu_combine_from_tables(int index_bytes, int split_bytes, int num_tables,
                                 const float* const* tables, const int64_t* table_rows,
                                 int64_t dim, const void* rows, int64_t num_rows,
                                 const int32_t* inverse, int64_t n, const void* splits,
                                 int64_t batch, const float* weights, int combiner, float* out,
                                 unsigned long long* first_bad_row,
                                 unsigned long long* first_bad_split,
                                 unsigned long long* first_bad_inverse) {
#define TFDE_COMBINE_FROM_TABLES(Index, Split)                                          \
  return CombineFromTablesHost<Index, Split>(num_tables, tables, table_rows, dim, rows, \
                                             num_rows, inverse, n, splits, batch, weights, \
                                             combiner, out, first_bad_row, first_bad_split, \
                                             first_bad_inverse)
  if (index_bytes == 8) {
    if (split_bytes == 8) TFDE_COMBINE_FROM_TABLES(int64_t, int64_t);
    TFDE_COMBINE_FROM_TABLES(int64_t, int32_t);
  }
  if (split_bytes == 8) TFDE_COMBINE_FROM_TABLES(int32_t, int64_t);
  TFDE_COMBINE_FROM_TABLES(int32_t, int32_t);
#undef TFDE_COMBINE_FROM_TABLES
}

// kind: 0 SGD [lr], 1 Adagrad [lr, epsilon], 2 lazy Adam [lr, beta_1, beta_2,
// epsilon, step], 3 FTRL [lr, l1, l2, l2_shrinkage, beta, learning_rate_power].
int tfde_gpu_sparse_apply(int kind, const float* hyper, int num_vars, float* const* vars,
                          int64_t num_rows, int64_t dim, int index_bytes, const void* indices,
                          int64_t n, const float* grad, int64_t grad_num_rows,
                          const int32_t* grad_rows, unsigned long long* first_out_of_range,
                          unsigned long long* first_repeat) {
  return index_bytes == 8
             ? Apply<int64_t>(kind, hyper, num_vars, vars, num_rows, dim, indices, n, grad,
                              grad_num_rows, grad_rows, first_out_of_range, first_repeat)
             : Apply<int32_t>(kind, hyper, num_vars, vars, num_rows, dim, indices, n, grad,
                              grad_num_rows, grad_rows, first_out_of_range, first_repeat);
}

// Times bench/ops_bench.py's step on the device: per table, unique -> gather
// -> combine (forward), then combine grad -> lazy Adam on the touched rows
// (training step), with the same host read of the unique count as the op.
// ids: [num_tables, batch * hot] int64 on the host. Writes the mean
// milliseconds over `repeats` after one warm-up, and the unique rows
// touched per step.
int tfde_gpu_time_step(const int64_t* ids_host, int num_tables, int64_t batch, int64_t hot,
                       int64_t vocab, int64_t dim, int repeats, float* forward_ms,
                       float* train_ms, int64_t* unique_rows) {
  const int64_t n = batch * hot;
  std::vector<DeviceBuffer> ids(num_tables), table(num_tables), m(num_tables), v(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    TFDE_CHECK_CUDA(ids[t].Upload(ids_host + t * n, n * sizeof(int64_t)));
    for (DeviceBuffer* b : {&table[t], &m[t], &v[t]}) {
      TFDE_CHECK_CUDA(b->Allocate(vocab * dim * sizeof(float)));
      TFDE_CHECK_CUDA(cudaMemset(b->as<void>(), 0, vocab * dim * sizeof(float)));
    }
  }
  std::vector<int64_t> splits_host(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) splits_host[b] = b * hot;
  DeviceBuffer splits, unique, inverse, counts, num_unique, rows, out, grad, row_grad,
      bag_of, coefficient, unique_ws, grad_ws;
  TFDE_CHECK_CUDA(splits.Upload(splits_host.data(), (batch + 1) * sizeof(int64_t)));
  TFDE_CHECK_CUDA(unique.Allocate(n * sizeof(int64_t)));
  TFDE_CHECK_CUDA(inverse.Allocate(n * sizeof(int32_t)));
  TFDE_CHECK_CUDA(counts.Allocate(n * sizeof(int32_t)));
  TFDE_CHECK_CUDA(num_unique.Allocate(sizeof(int32_t)));
  TFDE_CHECK_CUDA(rows.Allocate(n * dim * sizeof(float)));
  TFDE_CHECK_CUDA(row_grad.Allocate(n * dim * sizeof(float)));
  TFDE_CHECK_CUDA(out.Allocate(batch * dim * sizeof(float)));
  TFDE_CHECK_CUDA(grad.Allocate(batch * dim * sizeof(float)));
  TFDE_CHECK_CUDA(cudaMemset(grad.as<void>(), 0, batch * dim * sizeof(float)));
  TFDE_CHECK_CUDA(bag_of.Allocate(n * sizeof(int32_t)));
  TFDE_CHECK_CUDA(coefficient.Allocate(n * sizeof(float)));
  size_t unique_bytes = 0, grad_bytes = 0;
  TFDE_CHECK_CUDA(UniqueWithCounts<int64_t>(0, nullptr, n, nullptr, &unique_bytes, nullptr,
                                            nullptr, nullptr, nullptr));
  TFDE_CHECK_CUDA(EmbeddingCombineGrad<float>(0, nullptr, dim, nullptr, n, nullptr, nullptr,
                                              n, nullptr, &grad_bytes, nullptr));
  TFDE_CHECK_CUDA(unique_ws.Allocate(unique_bytes));
  TFDE_CHECK_CUDA(grad_ws.Allocate(grad_bytes));
  int64_t touched = 0;
  auto step = [&](bool train, int step_number) -> cudaError_t {
    touched = 0;
    for (int t = 0; t < num_tables; ++t) {
      size_t bytes = unique_bytes;
      cudaError_t err = UniqueWithCounts<int64_t>(
          0, ids[t].as<int64_t>(), n, unique_ws.as<void>(), &bytes, unique.as<int64_t>(),
          inverse.as<int32_t>(), counts.as<int32_t>(), num_unique.as<int32_t>());
      if (err != cudaSuccess) return err;
      int32_t k = 0;
      err = cudaMemcpy(&k, num_unique.as<void>(), sizeof(int32_t), cudaMemcpyDeviceToHost);
      if (err != cudaSuccess) return err;
      touched += k;
      TableGroup group{};
      group.count = 1;
      group.data[0] = table[t].as<float>();
      group.base[0] = 0;
      group.end = INT64_MAX;
      if ((err = GatherFromTables<int64_t>(0, group, dim, unique.as<int64_t>(), k,
                                           rows.as<float>())) != cudaSuccess) return err;
      if ((err = CombineCoefficients<int64_t>(0, splits.as<int64_t>(), batch, nullptr,
                                              Combiner::kSum, bag_of.as<int32_t>(),
                                              coefficient.as<float>())) != cudaSuccess) {
        return err;
      }
      if ((err = EmbeddingCombine<float, int64_t>(
               0, rows.as<float>(), dim, inverse.as<int32_t>(), splits.as<int64_t>(), batch,
               coefficient.as<float>(), out.as<float>())) != cudaSuccess) return err;
      if (!train) continue;
      bytes = grad_bytes;
      if ((err = EmbeddingCombineGrad<float>(0, grad.as<float>(), dim, inverse.as<int32_t>(),
                                             n, bag_of.as<int32_t>(),
                                             coefficient.as<float>(), k, grad_ws.as<void>(),
                                             &bytes, row_grad.as<float>())) != cudaSuccess) {
        return err;
      }
      float* vars[3] = {table[t].as<float>(), m[t].as<float>(), v[t].as<float>()};
      if ((err = SparseApply<int64_t>(0, MakeLazyAdamParams(0.001f, 0.9f, 0.999f, 1e-7f,
                                                            static_cast<float>(step_number)),
                                      vars, dim, unique.as<int64_t>(), k,
                                      row_grad.as<float>(), nullptr)) != cudaSuccess) {
        return err;
      }
    }
    return cudaDeviceSynchronize();
  };
  cudaEvent_t start, stop;
  TFDE_CHECK_CUDA(cudaEventCreate(&start));
  TFDE_CHECK_CUDA(cudaEventCreate(&stop));
  for (int train = 0; train < 2; ++train) {
    TFDE_CHECK_CUDA(step(train, 1));  // warm-up
    TFDE_CHECK_CUDA(cudaEventRecord(start));
    for (int r = 0; r < repeats; ++r) TFDE_CHECK_CUDA(step(train, r + 2));
    TFDE_CHECK_CUDA(cudaEventRecord(stop));
    TFDE_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    TFDE_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    (train ? *train_ms : *forward_ms) = ms / repeats;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  *unique_rows = touched;
  return 0;
}

}  // extern "C"
