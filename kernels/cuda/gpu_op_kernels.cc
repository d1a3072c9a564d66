// GPU kernels of tfde's ops: the same op definitions as the CPU kernels in
// kernels/*.cc, computed by the CUDA launchers in embedding_kernels.cu.h.
// Built only where TensorFlow has CUDA and nvcc exists (setup.py); the
// launchers themselves are tested on any GPU by tests/test_cuda_kernels.py.
//
// Input checks run on the device first; their results come back to the host
// in one small copy, so a bad input raises InvalidArgument naming the
// position and value, and nothing (no output, no table row) is written.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "../common.h"
#include "../input_checks.h"
#include "../sparse_updates.h"
#include "../variables.h"
#include "embedding_kernels.cu.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tfde {
namespace {

using ::tensorflow::DEVICE_GPU;
using ::tensorflow::DT_INT8;
using ::tensorflow::DT_UINT64;
using ::tensorflow::errors::Internal;
using GPUDevice = Eigen::GpuDevice;

cudaStream_t StreamOf(OpKernelContext* ctx) {
  return ctx->eigen_device<GPUDevice>().stream();
}

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return Internal(what, ": ", cudaGetErrorString(err));
}

#define TFDE_OP_REQUIRES_CUDA(ctx, what, ...) \
  OP_REQUIRES_OK(ctx, CudaStatus((__VA_ARGS__), what))

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
  unsigned long long first_bad(int k) const { return host_[k]; }
  bool ok(int k) const { return host_[k] == gpu::kNoError; }

 private:
  Tensor slots_;
  std::vector<unsigned long long> host_;
};

// One element of a device tensor, for error messages.
template <typename T>
T ReadElement(OpKernelContext* ctx, const Tensor& t, int64_t index) {
  T value{};
  cudaMemcpyAsync(&value, t.flat<T>().data() + index, sizeof(T), cudaMemcpyDeviceToHost,
                  StreamOf(ctx));
  cudaStreamSynchronize(StreamOf(ctx));
  return value;
}

void DeviceCopy(OpKernelContext* ctx, const Tensor& from, Tensor* to) {
  cudaMemcpyAsync(const_cast<char*>(to->tensor_data().data()), from.tensor_data().data(),
                  from.TotalBytes(), cudaMemcpyDeviceToDevice, StreamOf(ctx));
}

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

// ---- unique ----

template <typename Id>
class UniqueWithCountsGpuOp : public OpKernel {
 public:
  explicit UniqueWithCountsGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckIdVector(ids_t));
    const int64_t n = ids_t.NumElements();
    Tensor unique_buf, counts_buf, num_unique_dev;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(ids_t.dtype(), TensorShape({n}), &unique_buf));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({n}), &counts_buf));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({}), &num_unique_dev));
    Tensor* inverse_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ids_t.shape(), &inverse_t));
    cudaStream_t stream = StreamOf(ctx);
    OP_REQUIRES_OK(ctx, RunWithWorkspace(ctx, "unique", [&](void* ws, size_t* bytes) {
      return gpu::UniqueWithCounts<Id>(stream, ids_t.flat<Id>().data(), n, ws, bytes,
                                       unique_buf.flat<Id>().data(),
                                       inverse_t->flat<int32_t>().data(),
                                       counts_buf.flat<int32_t>().data(),
                                       num_unique_dev.scalar<int32_t>().data());
    }));
    // The output size is data-dependent: one small copy back, as tf.unique.
    const int32_t num_unique = ReadElement<int32_t>(ctx, num_unique_dev, 0);
    Tensor *unique_t = nullptr, *counts_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique}), &unique_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({num_unique}), &counts_t));
    TFDE_OP_REQUIRES_CUDA(ctx, "unique",
                          cudaMemcpyAsync(unique_t->flat<Id>().data(),
                                          unique_buf.flat<Id>().data(), num_unique * sizeof(Id),
                                          cudaMemcpyDeviceToDevice, stream));
    TFDE_OP_REQUIRES_CUDA(ctx, "unique",
                          cudaMemcpyAsync(counts_t->flat<int32_t>().data(),
                                          counts_buf.flat<int32_t>().data(),
                                          num_unique * sizeof(int32_t),
                                          cudaMemcpyDeviceToDevice, stream));
  }
};

// ---- partition ----

template <typename Id>
class PartitionByShardGpuOp : public OpKernel {
 public:
  explicit PartitionByShardGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dynamic", &dynamic_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    const Tensor& num_shards_t = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckIdVector(ids_t));
    int32_t num_shards;
    OP_REQUIRES_OK(ctx, ReadNumShards(num_shards_t, &num_shards));
    const int64_t n = ids_t.NumElements();
    cudaStream_t stream = StreamOf(ctx);
    if (!dynamic_) {
      DeviceChecks checks;
      OP_REQUIRES_OK(ctx, checks.Init(ctx, 1));
      TFDE_OP_REQUIRES_CUDA(ctx, "partition check",
                            gpu::FindOutOfRange<Id>(stream, ids_t.flat<Id>().data(), n, 0,
                                                    std::numeric_limits<int64_t>::max(),
                                                    checks.slot(0)));
      OP_REQUIRES_OK(ctx, checks.Read(ctx));
      const int64_t i = static_cast<int64_t>(checks.first_bad(0));
      OP_REQUIRES(ctx, checks.ok(0),
                  InvalidArgument("ids[", i, "] = ", ReadElement<Id>(ctx, ids_t, i),
                                  " is negative; a static table has rows "
                                  "0..vocabulary_size-1"));
    }
    Tensor *local_t, *counts_t, *positions_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids_t.shape(), &local_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_shards}), &counts_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ids_t.shape(), &positions_t));
    OP_REQUIRES_OK(ctx, RunWithWorkspace(ctx, "partition", [&](void* ws, size_t* bytes) {
      return gpu::PartitionByShard<Id>(stream, ids_t.flat<Id>().data(), n, num_shards,
                                       dynamic_, ws, bytes, local_t->flat<Id>().data(),
                                       counts_t->flat<int32_t>().data(),
                                       positions_t->flat<int32_t>().data());
    }));
  }

 private:
  bool dynamic_;
};

// ---- combine ----

// After the shape checks (CheckCombineInputs): checks the row splits and
// the inverse index against `num_rows` on the device, then computes each
// id's sample and coefficient.
template <typename Split>
Status PrepareCombine(OpKernelContext* ctx, const Tensor& inverse_t, const Tensor& splits_t,
                      const Tensor& weights_t, int64_t num_rows, gpu::Combiner combiner,
                      Tensor* bag_of, Tensor* coefficient) {
  const int64_t n = inverse_t.NumElements();
  const int64_t batch = splits_t.NumElements() - 1;
  const int64_t num_weights = weights_t.NumElements();
  cudaStream_t stream = StreamOf(ctx);
  DeviceChecks checks;
  TF_RETURN_IF_ERROR(checks.Init(ctx, 2));
  TF_RETURN_IF_ERROR(CudaStatus(gpu::FindBadSplit<Split>(stream, splits_t.flat<Split>().data(),
                                                         batch, n, checks.slot(0)),
                                "combine check"));
  TF_RETURN_IF_ERROR(CudaStatus(
      gpu::FindOutOfRange<int32_t>(stream, inverse_t.flat<int32_t>().data(), n, 0, num_rows,
                                   checks.slot(1)),
      "combine check"));
  TF_RETURN_IF_ERROR(checks.Read(ctx));
  if (!checks.ok(0)) {
    const int64_t b = static_cast<int64_t>(checks.first_bad(0));
    const int64_t value = static_cast<int64_t>(ReadElement<Split>(ctx, splits_t, b));
    if (b == 0) return InvalidArgument("row_splits[0] must be 0, got ", value);
    if (b == batch && value >= static_cast<int64_t>(ReadElement<Split>(ctx, splits_t, b - 1))) {
      return InvalidArgument("row_splits[-1] = ", value,
                             " must equal the number of ids, ", n);
    }
    return InvalidArgument("row_splits must be non-decreasing: row_splits[", b, "] = ", value,
                           " < row_splits[", b - 1, "]");
  }
  if (!checks.ok(1)) {
    const int64_t i = static_cast<int64_t>(checks.first_bad(1));
    return InvalidArgument("inverse[", i, "] = ", ReadElement<int32_t>(ctx, inverse_t, i),
                           " is out of range [0, ", num_rows, ")");
  }
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({n}), bag_of));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({n}), coefficient));
  return CudaStatus(gpu::CombineCoefficients<Split>(
                        stream, splits_t.flat<Split>().data(), batch,
                        num_weights ? weights_t.flat<float>().data() : nullptr, combiner,
                        bag_of->flat<int32_t>().data(), coefficient->flat<float>().data()),
                    "combine coefficients");
}

template <typename T, typename Split>
class EmbeddingCombineGpuOp : public OpKernel {
 public:
  explicit EmbeddingCombineGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &name));
    OP_REQUIRES_OK(ctx, ParseCombiner(name, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(0);
    const Tensor& inverse_t = ctx->input(1);
    const Tensor& splits_t = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckCombineInputs(rows_t, "rows", inverse_t, splits_t, ctx->input(3)));
    Tensor bag_of, coefficient;
    OP_REQUIRES_OK(ctx, PrepareCombine<Split>(ctx, inverse_t, splits_t, ctx->input(3),
                                              rows_t.dim_size(0), combiner_, &bag_of,
                                              &coefficient));
    const int64_t batch = splits_t.NumElements() - 1;
    const int64_t dim = rows_t.dim_size(1);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, dim}), &out_t));
    TFDE_OP_REQUIRES_CUDA(ctx, "combine",
                          gpu::EmbeddingCombine(StreamOf(ctx), CudaData<T>(rows_t), dim,
                                                inverse_t.flat<int32_t>().data(),
                                                splits_t.flat<Split>().data(), batch,
                                                coefficient.flat<float>().data(),
                                                CudaData<T>(out_t)));
  }

 private:
  gpu::Combiner combiner_;
};

template <typename T, typename Split>
class EmbeddingCombineGradGpuOp : public OpKernel {
 public:
  explicit EmbeddingCombineGradGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &name));
    OP_REQUIRES_OK(ctx, ParseCombiner(name, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad_t = ctx->input(0);
    const Tensor& inverse_t = ctx->input(1);
    const Tensor& splits_t = ctx->input(2);
    const Tensor& num_unique_t = ctx->input(4);
    int64_t num_unique;
    OP_REQUIRES_OK(ctx, CheckCombineGradInputs(grad_t, inverse_t, splits_t, ctx->input(3),
                                               num_unique_t, &num_unique));
    Tensor bag_of, coefficient;
    OP_REQUIRES_OK(ctx, PrepareCombine<Split>(ctx, inverse_t, splits_t, ctx->input(3),
                                              num_unique, combiner_, &bag_of, &coefficient));
    const int64_t dim = grad_t.dim_size(1);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique, dim}), &out_t));
    OP_REQUIRES_OK(ctx, RunWithWorkspace(ctx, "combine grad", [&](void* ws, size_t* bytes) {
      return gpu::EmbeddingCombineGrad(StreamOf(ctx), CudaData<T>(grad_t), dim,
                                       inverse_t.flat<int32_t>().data(),
                                       inverse_t.NumElements(), bag_of.flat<int32_t>().data(),
                                       coefficient.flat<float>().data(), num_unique, ws,
                                       bytes, CudaData<T>(out_t));
    }));
  }

 private:
  gpu::Combiner combiner_;
};

// ---- gather ----

template <typename Index>
class GatherFromTablesGpuOp : public OpKernel {
 public:
  explicit GatherFromTablesGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bases", &bases_));
    OP_REQUIRES(ctx, static_cast<int>(bases_.size()) == num_tables_,
                InvalidArgument("bases has ", bases_.size(), " entries for ", num_tables_,
                                " tables"));
    for (int t = 0; t < num_tables_; ++t) {
      OP_REQUIRES(ctx, t == 0 ? bases_[0] == 0 : bases_[t] > bases_[t - 1],
                  InvalidArgument("bases must start at 0 and increase, got bases[", t,
                                  "] = ", bases_[t]));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Acquire(ctx, 0, num_tables_, LockMode::kShared));
    const int64_t dim = vars.dim(0);
    for (int t = 0; t < num_tables_; ++t) {
      OP_REQUIRES(ctx, vars.dim(t) == dim,
                  InvalidArgument("table ", t, " has width ", vars.dim(t),
                                  " but table 0 has width ", dim));
      if (t + 1 < num_tables_) {
        OP_REQUIRES(ctx, vars.num_rows(t) >= bases_[t + 1] - bases_[t],
                    InvalidArgument("table ", t, " has ", vars.num_rows(t),
                                    " rows but its range needs ", bases_[t + 1] - bases_[t]));
      }
    }
    const int64_t total = bases_[num_tables_ - 1] + vars.num_rows(num_tables_ - 1);
    const Tensor& rows_t = ctx->input(num_tables_);
    OP_REQUIRES(ctx, rows_t.dims() == 1,
                InvalidArgument("rows must be a vector, got shape ",
                                rows_t.shape().DebugString()));
    const int64_t m = rows_t.NumElements();
    cudaStream_t stream = StreamOf(ctx);
    DeviceChecks checks;
    OP_REQUIRES_OK(ctx, checks.Init(ctx, 1));
    TFDE_OP_REQUIRES_CUDA(ctx, "gather check",
                          gpu::FindOutOfRange<Index>(stream, rows_t.flat<Index>().data(), m,
                                                     0, total, checks.slot(0)));
    OP_REQUIRES_OK(ctx, checks.Read(ctx));
    const int64_t bad = static_cast<int64_t>(checks.first_bad(0));
    OP_REQUIRES(ctx, checks.ok(0),
                InvalidArgument("rows[", bad, "] = ", ReadElement<Index>(ctx, rows_t, bad),
                                " is outside every table of the group"));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, dim}), &out_t));
    for (int t0 = 0; t0 < num_tables_; t0 += gpu::kMaxTablesPerLaunch) {
      gpu::TableGroup group{};
      group.count = std::min(gpu::kMaxTablesPerLaunch, num_tables_ - t0);
      for (int k = 0; k < group.count; ++k) {
        group.data[k] = vars.tensor(t0 + k).flat<float>().data();
        group.base[k] = bases_[t0 + k];
      }
      group.end = t0 + group.count < num_tables_ ? bases_[t0 + group.count]
                                                 : std::numeric_limits<int64_t>::max();
      TFDE_OP_REQUIRES_CUDA(ctx, "gather",
                            gpu::GatherFromTables<Index>(stream, group, dim,
                                                         rows_t.flat<Index>().data(), m,
                                                         out_t->flat<float>().data()));
    }
  }

 private:
  int num_tables_;
  std::vector<int64_t> bases_;
};

// ---- sparse optimizers ----

// The optimizers' scalar inputs are read as the CPU kernels read them
// (sparse_updates.h); their Params are the launchers' (kernel_params.h).

template <typename Index, typename Update>
class SparseApplyGpuOp : public OpKernel {
 public:
  explicit SparseApplyGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    constexpr int kNumVars = Update::kNumVars;
    typename Update::Params params;
    OP_REQUIRES_OK(ctx, Update::ReadParams(ctx, kNumVars + 3, &params));
    const Tensor& indices_t = ctx->input(kNumVars);
    const Tensor& grad_t = ctx->input(kNumVars + 1);
    const Tensor& grad_rows_t = ctx->input(kNumVars + 2);
    bool select;
    OP_REQUIRES_OK(ctx, CheckUpdateInputs(indices_t, grad_t, grad_rows_t, "indices", &select));
    const int64_t n = indices_t.NumElements();
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Acquire(ctx, 0, kNumVars, LockMode::kExclusive));
    OP_REQUIRES_OK(ctx, vars.CheckUpdateTargets(ctx, 0, grad_t));
    const int64_t dim = vars.dim();
    const int64_t num_rows = vars.num_rows();
    cudaStream_t stream = StreamOf(ctx);
    DeviceChecks checks;
    OP_REQUIRES_OK(ctx, checks.Init(ctx, 3));
    const Index* indices = indices_t.flat<Index>().data();
    TFDE_OP_REQUIRES_CUDA(ctx, "update check",
                          gpu::FindOutOfRange<Index>(stream, indices, n, 0, num_rows,
                                                     checks.slot(0)));
    if (select) {
      TFDE_OP_REQUIRES_CUDA(ctx, "update check",
                            gpu::FindOutOfRange<int32_t>(stream,
                                                         grad_rows_t.flat<int32_t>().data(),
                                                         n, 0, grad_t.dim_size(0),
                                                         checks.slot(1)));
    }
    OP_REQUIRES_OK(ctx, RunWithWorkspace(ctx, "update check", [&](void* ws, size_t* bytes) {
      return gpu::FindRepeatedIndex<Index>(stream, indices, n, ws, bytes, checks.slot(2));
    }));
    OP_REQUIRES_OK(ctx, checks.Read(ctx));
    const int64_t bad_row = static_cast<int64_t>(checks.first_bad(0));
    OP_REQUIRES(ctx, checks.ok(0),
                InvalidArgument("indices[", bad_row, "] = ",
                                ReadElement<Index>(ctx, indices_t, bad_row),
                                " is out of range [0, ", num_rows, ")"));
    const int64_t bad_grad = static_cast<int64_t>(checks.first_bad(1));
    OP_REQUIRES(ctx, checks.ok(1),
                InvalidArgument("grad_rows[", bad_grad, "] = ",
                                ReadElement<int32_t>(ctx, grad_rows_t, bad_grad),
                                " is out of range [0, ", grad_t.dim_size(0), ")"));
    const int64_t later = static_cast<int64_t>(checks.first_bad(2) >> 32);
    const int64_t first = static_cast<int64_t>(checks.first_bad(2) & 0xffffffffull);
    OP_REQUIRES(ctx, checks.ok(2),
                InvalidArgument("indices[", later, "] = ",
                                ReadElement<Index>(ctx, indices_t, later), " repeats indices[",
                                first, "]; sum the gradients of a row before applying them"));
    OP_REQUIRES_OK(ctx, vars.MakeWritable(ctx, [ctx](const Tensor& from, Tensor* to) {
      DeviceCopy(ctx, from, to);
    }));
    float* pointers[3] = {nullptr, nullptr, nullptr};
    for (int v = 0; v < kNumVars; ++v) pointers[v] = vars.Rows(v);
    TFDE_OP_REQUIRES_CUDA(ctx, "sparse update",
                          gpu::SparseApply<Index>(stream, params, pointers, dim, indices, n,
                                                  grad_t.flat<float>().data(),
                                                  select ? grad_rows_t.flat<int32_t>().data()
                                                         : nullptr));
  }
};

#define TFDE_REGISTER_ID_KERNELS(Id)                                                     \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("TfdeUniqueWithCounts").Device(DEVICE_GPU).TypeConstraint<Id>("T"),           \
      UniqueWithCountsGpuOp<Id>);                                                        \
  REGISTER_KERNEL_BUILDER(Name("TfdePartitionByShard")                                   \
                              .Device(DEVICE_GPU)                                        \
                              .HostMemory("num_shards")                                  \
                              .TypeConstraint<Id>("T"),                                  \
                          PartitionByShardGpuOp<Id>);                                    \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("TfdeGatherFromTables").Device(DEVICE_GPU).TypeConstraint<Id>("Tindices"),    \
      GatherFromTablesGpuOp<Id>);
TFDE_REGISTER_ID_KERNELS(int32_t)
TFDE_REGISTER_ID_KERNELS(int64_t)
#undef TFDE_REGISTER_ID_KERNELS

// The launchers read an int32 inverse; an int64 one runs on the CPU kernel.
#define TFDE_REGISTER_COMBINE(T, Split)                                    \
  REGISTER_KERNEL_BUILDER(Name("TfdeEmbeddingCombine")                     \
                              .Device(DEVICE_GPU)                          \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<Split>("Tsplits")            \
                              .TypeConstraint<int32_t>("Tinverse"),        \
                          EmbeddingCombineGpuOp<T, Split>);                \
  REGISTER_KERNEL_BUILDER(Name("TfdeEmbeddingCombineGrad")                 \
                              .Device(DEVICE_GPU)                          \
                              .HostMemory("num_unique")                    \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<Split>("Tsplits")            \
                              .TypeConstraint<int32_t>("Tinverse"),        \
                          EmbeddingCombineGradGpuOp<T, Split>);
#define TFDE_REGISTER_COMBINE_ALL_SPLITS(T) \
  TFDE_REGISTER_COMBINE(T, int32_t)         \
  TFDE_REGISTER_COMBINE(T, int64_t)
TFDE_REGISTER_COMBINE_ALL_SPLITS(float)
TFDE_REGISTER_COMBINE_ALL_SPLITS(Eigen::half)
TFDE_REGISTER_COMBINE_ALL_SPLITS(Eigen::bfloat16)
#undef TFDE_REGISTER_COMBINE_ALL_SPLITS
#undef TFDE_REGISTER_COMBINE

// Every hyperparameter is a scalar read on the host.
#define TFDE_REGISTER_APPLY(op_name, Update, Index, ...)                       \
  REGISTER_KERNEL_BUILDER(Name(op_name)                                       \
                              .Device(DEVICE_GPU)                             \
                              .HostMemory("learning_rate")                    \
                              __VA_ARGS__                                     \
                              .TypeConstraint<Index>("Tindices")              \
                              .TypeConstraint<int32_t>("Tgrad_rows"),         \
                          SparseApplyGpuOp<Index, Update>);
#define TFDE_REGISTER_APPLY_ALL(op_name, Update, ...)        \
  TFDE_REGISTER_APPLY(op_name, Update, int32_t, __VA_ARGS__) \
  TFDE_REGISTER_APPLY(op_name, Update, int64_t, __VA_ARGS__)
TFDE_REGISTER_APPLY_ALL("TfdeSparseApplySgd", SgdUpdate, )
TFDE_REGISTER_APPLY_ALL("TfdeSparseApplyAdagrad", AdagradUpdate, .HostMemory("epsilon"))
TFDE_REGISTER_APPLY_ALL("TfdeSparseApplyLazyAdam", LazyAdamUpdate,
                        .HostMemory("beta_1").HostMemory("beta_2")
                        .HostMemory("epsilon").HostMemory("step"))
TFDE_REGISTER_APPLY_ALL("TfdeSparseApplyFtrl", FtrlUpdate,
                        .HostMemory("l1").HostMemory("l2").HostMemory("l2_shrinkage")
                        .HostMemory("beta").HostMemory("learning_rate_power"))
#undef TFDE_REGISTER_APPLY_ALL
#undef TFDE_REGISTER_APPLY

}  // namespace
}  // namespace tfde

#endif  // GOOGLE_CUDA
