// The GPU functors of tfde's op classes (declared in kernels/*_functor.h and
// kernels/device.h): each enqueues the CUDA launchers of
// embedding_kernels.cu.h on the op's stream. The op classes, with their
// attributes, input checks, outputs and error messages, are the CPU's own
// (kernels/*_op.cc, registered for DEVICE_GPU under GOOGLE_CUDA). Built only
// where TensorFlow has CUDA and nvcc exists (setup.py); the launchers
// themselves are tested on any GPU by tests/test_cuda_kernels.py.
//
// A functor's checks run on the device first and come back to the host in
// one small copy, so a bad input is reported by position and value and
// nothing (no output, no table row) is written.
#if GOOGLE_CUDA
#define EIGEN_USE_THREADS
#define EIGEN_USE_GPU

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "../combine_functor.h"
#include "../device.h"
#include "../gather_functor.h"
#include "../partition_functor.h"
#include "../sparse_apply_functor.h"
#include "../unique_functor.h"
#include "embedding_kernels.cu.h"

namespace tfde {
namespace {

using ::tensorflow::DT_INT8;
using ::tensorflow::DT_UINT64;
using ::tensorflow::errors::Internal;

cudaStream_t StreamOf(OpKernelContext* ctx) {
  return ctx->eigen_device<GPUDevice>().stream();
}

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return Internal(what, ": ", cudaGetErrorString(err));
}

// Scratch memory from TensorFlow's allocator, for the CUB-style launchers.
template <typename Launch>
Status RunWithWorkspace(OpKernelContext* ctx, const char* what, Launch launch) {
  size_t bytes = 0;
  TF_RETURN_IF_ERROR(CudaStatus(launch(nullptr, &bytes), what));
  Tensor workspace;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(
      DT_INT8, TensorShape({static_cast<int64_t>(bytes) + 1}), &workspace));
  return CudaStatus(launch(workspace.flat<int8_t>().data(), &bytes), what);
}

// A set of device-side checks, read back with one copy.
class DeviceChecks {
 public:
  Status Init(OpKernelContext* ctx, int count) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_UINT64, TensorShape({count}), &slots_));
    host_.assign(count, gpu::kNoError);
    for (int k = 0; k < count; ++k) {
      TF_RETURN_IF_ERROR(CudaStatus(gpu::InitFirstBad(StreamOf(ctx), slot(k)), "check"));
    }
    return absl::OkStatus();
  }
  unsigned long long* slot(int k) {
    return reinterpret_cast<unsigned long long*>(slots_.flat<uint64_t>().data()) + k;
  }
  // Waits for the checks; afterwards first_bad(k) is on the host.
  Status Read(OpKernelContext* ctx) {
    cudaStream_t stream = StreamOf(ctx);
    TF_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(host_.data(), slot(0), host_.size() * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost, stream),
        "reading checks"));
    return CudaStatus(cudaStreamSynchronize(stream), "reading checks");
  }
  unsigned long long raw(int k) const { return host_[k]; }
  // The first offending position of check k, or -1.
  int64_t first_bad(int k) const {
    return host_[k] == gpu::kNoError ? -1 : static_cast<int64_t>(host_[k]);
  }

 private:
  Tensor slots_;
  std::vector<unsigned long long> host_;
};

// TensorFlow's 16-bit float types and CUDA's share their layout.
template <typename T>
struct CudaType { using type = T; };
template <>
struct CudaType<Eigen::half> { using type = __half; };
template <>
struct CudaType<Eigen::bfloat16> { using type = __nv_bfloat16; };

template <typename T>
const typename CudaType<T>::type* CudaData(const Tensor& t) {
  return reinterpret_cast<const typename CudaType<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename CudaType<T>::type* CudaData(Tensor* t) {
  return reinterpret_cast<typename CudaType<T>::type*>(t->flat<T>().data());
}

// The launches over a group's tables, up to kMaxTablesPerLaunch tables
// each: launch(group, first) for consecutive tables, first true for the
// first launch.
template <typename Launch>
Status ForEachTableLaunch(const FusedTables& tables, const char* what, Launch launch) {
  bool first = true;
  for (const gpu::TableGroup& group :
       gpu::TableLaunches(tables.num_tables(), tables.all_data(), tables.all_bases())) {
    TF_RETURN_IF_ERROR(CudaStatus(launch(group, first), what));
    first = false;
  }
  return absl::OkStatus();
}

}  // namespace

namespace functor {

// ---- device.h

template <typename T>
Status FindOutOfRange<GPUDevice, T>::operator()(OpKernelContext* ctx, const Tensor& values,
                                                int64_t lo, int64_t hi,
                                                int64_t* first_bad) const {
  DeviceChecks checks;
  TF_RETURN_IF_ERROR(checks.Init(ctx, 1));
  TF_RETURN_IF_ERROR(CudaStatus(gpu::FindOutOfRange<T>(StreamOf(ctx), values.flat<T>().data(),
                                                       values.NumElements(), lo, hi,
                                                       checks.slot(0)),
                                "range check"));
  TF_RETURN_IF_ERROR(checks.Read(ctx));
  *first_bad = checks.first_bad(0);
  return absl::OkStatus();
}

template <typename T>
T ReadElement<GPUDevice, T>::operator()(OpKernelContext* ctx, const Tensor& t,
                                        int64_t i) const {
  T value{};
  cudaMemcpyAsync(&value, t.flat<T>().data() + i, sizeof(T), cudaMemcpyDeviceToHost,
                  StreamOf(ctx));
  cudaStreamSynchronize(StreamOf(ctx));
  return value;
}

void CopyBuffer<GPUDevice>::operator()(OpKernelContext* ctx, const Tensor& from,
                                       Tensor* to) const {
  cudaMemcpyAsync(const_cast<char*>(to->tensor_data().data()), from.tensor_data().data(),
                  from.TotalBytes(), cudaMemcpyDeviceToDevice, StreamOf(ctx));
}

// ---- unique_functor.h

template <typename Id>
Status UniqueWithCounts<GPUDevice, Id>::operator()(OpKernelContext* ctx, const Tensor& ids,
                                                   Tensor* inverse,
                                                   const AllocateUniqueOutputs& allocate) const {
  const int64_t n = ids.NumElements();
  Tensor unique_buf, counts_buf, num_unique_dev;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(ids.dtype(), TensorShape({n}), &unique_buf));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({n}), &counts_buf));
  TF_RETURN_IF_ERROR(
      ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({}), &num_unique_dev));
  cudaStream_t stream = StreamOf(ctx);
  TF_RETURN_IF_ERROR(RunWithWorkspace(ctx, "unique", [&](void* ws, size_t* bytes) {
    return gpu::UniqueWithCounts<Id>(stream, ids.flat<Id>().data(), n, ws, bytes,
                                     unique_buf.flat<Id>().data(),
                                     inverse->flat<int32_t>().data(),
                                     counts_buf.flat<int32_t>().data(),
                                     num_unique_dev.scalar<int32_t>().data());
  }));
  // The output size is data-dependent: one small copy back, as tf.unique.
  const int32_t num_unique = ReadElement<GPUDevice, int32_t>()(ctx, num_unique_dev, 0);
  Tensor *unique, *counts;
  TF_RETURN_IF_ERROR(allocate(num_unique, &unique, &counts));
  TF_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(unique->flat<Id>().data(), unique_buf.flat<Id>().data(),
                      num_unique * sizeof(Id), cudaMemcpyDeviceToDevice, stream),
      "unique"));
  return CudaStatus(
      cudaMemcpyAsync(counts->flat<int32_t>().data(), counts_buf.flat<int32_t>().data(),
                      num_unique * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream),
      "unique");
}

// ---- partition_functor.h

template <typename Id>
Status PartitionByShard<GPUDevice, Id>::operator()(OpKernelContext* ctx, const Tensor& ids,
                                                   int32_t num_shards, bool dynamic,
                                                   Tensor* local_ids, Tensor* shard_counts,
                                                   Tensor* positions) const {
  return RunWithWorkspace(ctx, "partition", [&](void* ws, size_t* bytes) {
    return gpu::PartitionByShard<Id>(StreamOf(ctx), ids.flat<Id>().data(), ids.NumElements(),
                                     num_shards, dynamic, ws, bytes,
                                     local_ids->flat<Id>().data(),
                                     shard_counts->flat<int32_t>().data(),
                                     positions->flat<int32_t>().data());
  });
}

// ---- combine_functor.h

template <typename Split>
Status CombineCoefficients<GPUDevice, Split>::operator()(
    OpKernelContext* ctx, const Tensor& inverse, const Tensor& splits, const Tensor& weights,
    int64_t num_rows, Combiner combiner, Coefficients* out, RaggedBatchErrors* errors) const {
  if (inverse.dtype() != tensorflow::DT_INT32) {
    // Not registered: an int64 inverse runs on the CPU kernels.
    return Internal("the GPU combine kernels take an int32 inverse");
  }
  const int64_t n = inverse.NumElements();
  const int64_t batch = splits.NumElements() - 1;
  cudaStream_t stream = StreamOf(ctx);
  DeviceChecks checks;
  TF_RETURN_IF_ERROR(checks.Init(ctx, 2));
  TF_RETURN_IF_ERROR(CudaStatus(
      gpu::FindBadSplit<Split>(stream, splits.flat<Split>().data(), batch, n, checks.slot(0)),
      "combine check"));
  TF_RETURN_IF_ERROR(CudaStatus(
      gpu::FindOutOfRange<int32_t>(stream, inverse.flat<int32_t>().data(), n, 0,
                                   IndexBound(num_rows), checks.slot(1)),
      "combine check"));
  TF_RETURN_IF_ERROR(checks.Read(ctx));
  errors->split = checks.first_bad(0);
  errors->inverse = errors->split >= 0 ? -1 : checks.first_bad(1);
  if (errors->split >= 0 || errors->inverse >= 0) return absl::OkStatus();
  out->inverse = inverse.flat<int32_t>().data();
  out->rows_read = num_rows;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({n}), &out->bag_of));
  TF_RETURN_IF_ERROR(
      ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({n}), &out->coefficient));
  return CudaStatus(gpu::CombineCoefficients<Split>(
                        stream, splits.flat<Split>().data(), batch,
                        weights.NumElements() ? weights.flat<float>().data() : nullptr,
                        combiner, out->bag_of.flat<int32_t>().data(),
                        out->coefficient.flat<float>().data()),
                    "combine coefficients");
}

template <typename T, typename Split>
Status EmbeddingCombine<GPUDevice, T, Split>::operator()(OpKernelContext* ctx,
                                                         const Tensor& rows,
                                                         const Tensor& splits,
                                                         const Coefficients& c,
                                                         Tensor* out) const {
  return CudaStatus(gpu::EmbeddingCombine(StreamOf(ctx), CudaData<T>(rows), rows.dim_size(1),
                                          c.inverse, splits.flat<Split>().data(),
                                          splits.NumElements() - 1,
                                          c.coefficient.flat<float>().data(), CudaData<T>(out)),
                    "combine");
}

template <typename T>
Status EmbeddingCombineGrad<GPUDevice, T>::operator()(OpKernelContext* ctx, const Tensor& grad,
                                                      const Coefficients& c,
                                                      Tensor* out) const {
  return RunWithWorkspace(ctx, "combine grad", [&](void* ws, size_t* bytes) {
    return gpu::EmbeddingCombineGrad(StreamOf(ctx), CudaData<T>(grad), grad.dim_size(1),
                                     c.inverse, c.bag_of.NumElements(),
                                     c.bag_of.flat<int32_t>().data(),
                                     c.coefficient.flat<float>().data(), out->dim_size(0), ws,
                                     bytes, CudaData<T>(out));
  });
}

// ---- gather_functor.h

template <typename Index>
Status GatherFromTables<GPUDevice, Index>::operator()(OpKernelContext* ctx,
                                                      const FusedTables& tables,
                                                      const Tensor& rows, Tensor* out,
                                                      int64_t* bad_row) const {
  // Tables cover consecutive row ranges from 0 without holes (the op checked
  // their sizes), so a row is valid when it lies below the last table's end.
  TF_RETURN_IF_ERROR(
      FindOutOfRange<GPUDevice, Index>()(ctx, rows, 0, tables.end(), bad_row));
  if (*bad_row >= 0) return absl::OkStatus();
  return ForEachTableLaunch(tables, "gather", [&](const gpu::TableGroup& group, bool) {
    return gpu::GatherFromTables<Index>(StreamOf(ctx), group, tables.dim(),
                                        rows.flat<Index>().data(), rows.NumElements(),
                                        out->flat<float>().data());
  });
}

template <typename Index, typename Split>
Status CombineFromTables<GPUDevice, Index, Split>::operator()(
    OpKernelContext* ctx, const FusedTables& tables, const Tensor& rows,
    const Tensor& splits, const Coefficients& c, Tensor* out, int64_t* bad_row) const {
  TF_RETURN_IF_ERROR(
      FindOutOfRange<GPUDevice, Index>()(ctx, rows, 0, tables.end(), bad_row));
  if (*bad_row >= 0) return absl::OkStatus();
  return ForEachTableLaunch(tables, "combine from tables",
                            [&](const gpu::TableGroup& group, bool first) {
    return gpu::CombineFromTables<Index, Split>(
        StreamOf(ctx), group, tables.dim(), rows.flat<Index>().data(), c.inverse,
        splits.flat<Split>().data(), splits.NumElements() - 1,
        c.coefficient.flat<float>().data(), /*accumulate=*/!first, out->flat<float>().data());
  });
}

// ---- sparse_apply_functor.h

template <typename Index>
Status FindBadUpdateRows<GPUDevice, Index>::operator()(OpKernelContext* ctx,
                                                       const Tensor& indices, int64_t num_rows,
                                                       const Tensor* grad_rows,
                                                       int64_t grad_num_rows,
                                                       UpdateRowErrors* errors) const {
  const Index* data = indices.flat<Index>().data();
  const int64_t n = indices.NumElements();
  cudaStream_t stream = StreamOf(ctx);
  DeviceChecks checks;
  TF_RETURN_IF_ERROR(checks.Init(ctx, 3));
  TF_RETURN_IF_ERROR(CudaStatus(
      gpu::FindOutOfRange<Index>(stream, data, n, 0, num_rows, checks.slot(0)), "update check"));
  if (grad_rows && grad_rows->NumElements() > 0) {
    TF_RETURN_IF_ERROR(CudaStatus(
        gpu::FindOutOfRange<int32_t>(stream, grad_rows->flat<int32_t>().data(),
                                     grad_rows->NumElements(), 0, IndexBound(grad_num_rows),
                                     checks.slot(1)),
        "update check"));
  }
  TF_RETURN_IF_ERROR(RunWithWorkspace(ctx, "update check", [&](void* ws, size_t* bytes) {
    return gpu::FindRepeatedIndex<Index>(stream, data, n, ws, bytes, checks.slot(2));
  }));
  TF_RETURN_IF_ERROR(checks.Read(ctx));
  errors->grad_row = checks.first_bad(1);
  errors->out_of_range = checks.first_bad(0);
  if (checks.first_bad(2) >= 0) {
    errors->repeat = static_cast<int64_t>(checks.raw(2) >> 32);
    errors->first = static_cast<int64_t>(checks.raw(2) & 0xffffffffull);
  }
  return absl::OkStatus();
}

template <typename Index, typename Update>
Status SparseApply<GPUDevice, Index, Update, DenseGradients>::operator()(
    OpKernelContext* ctx, const typename Update::Params& params, LockedVariables* vars,
    const Tensor& indices, const Gradients& grads, const Tensor* grad_rows) const {
  float* pointers[3] = {nullptr, nullptr, nullptr};
  for (int v = 0; v < Update::kNumVars; ++v) pointers[v] = vars->Rows(v);
  return CudaStatus(
      gpu::SparseApply<Index>(StreamOf(ctx), params, pointers, vars->dim(),
                              indices.flat<Index>().data(), indices.NumElements(), grads.grad,
                              grad_rows ? grad_rows->flat<int32_t>().data() : nullptr),
      "sparse update");
}

// ---- instantiations for the op classes' registrations

#define TFDE_INSTANTIATE_INDEX(Index)                             \
  template struct FindOutOfRange<GPUDevice, Index>;               \
  template struct ReadElement<GPUDevice, Index>;                  \
  template struct UniqueWithCounts<GPUDevice, Index>;             \
  template struct PartitionByShard<GPUDevice, Index>;             \
  template struct CombineCoefficients<GPUDevice, Index>;          \
  template struct GatherFromTables<GPUDevice, Index>;             \
  template struct FindBadUpdateRows<GPUDevice, Index>;            \
  template struct SparseApply<GPUDevice, Index, SgdUpdate, DenseGradients>;      \
  template struct SparseApply<GPUDevice, Index, AdagradUpdate, DenseGradients>;  \
  template struct SparseApply<GPUDevice, Index, LazyAdamUpdate, DenseGradients>; \
  template struct SparseApply<GPUDevice, Index, FtrlUpdate, DenseGradients>;
TFDE_INSTANTIATE_INDEX(int32_t)
TFDE_INSTANTIATE_INDEX(int64_t)
#undef TFDE_INSTANTIATE_INDEX

#define TFDE_INSTANTIATE_COMBINE_FROM_TABLES(Index)            \
  template struct CombineFromTables<GPUDevice, Index, int32_t>; \
  template struct CombineFromTables<GPUDevice, Index, int64_t>;
TFDE_INSTANTIATE_COMBINE_FROM_TABLES(int32_t)
TFDE_INSTANTIATE_COMBINE_FROM_TABLES(int64_t)
#undef TFDE_INSTANTIATE_COMBINE_FROM_TABLES

#define TFDE_INSTANTIATE_ROWS(T)                            \
  template struct EmbeddingCombine<GPUDevice, T, int32_t>;  \
  template struct EmbeddingCombine<GPUDevice, T, int64_t>;  \
  template struct EmbeddingCombineGrad<GPUDevice, T>;
TFDE_INSTANTIATE_ROWS(float)
TFDE_INSTANTIATE_ROWS(Eigen::half)
TFDE_INSTANTIATE_ROWS(Eigen::bfloat16)
#undef TFDE_INSTANTIATE_ROWS

}  // namespace functor
}  // namespace tfde

#endif  // GOOGLE_CUDA
