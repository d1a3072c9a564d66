// The per-device parts of the sparse optimizer ops (sparse_optimizer_ops.cc)
// and where an update's gradient rows come from.
#ifndef TFDE_KERNELS_SPARSE_APPLY_FUNCTOR_H_
#define TFDE_KERNELS_SPARSE_APPLY_FUNCTOR_H_

#include "bag_gradients.h"
#include "device.h"
#include "sparse_updates.h"
#include "variables.h"

namespace tfde {

// Where a row's gradient comes from: a [k, dim] matrix (one input) ...
struct DenseGradients {
  static constexpr int kNumInputs = 1;
  const float* grad = nullptr;
  int64_t num_rows = 0;
  int64_t dim = 0;
  Status Read(OpKernelContext* ctx, int first) {
    const Tensor& t = ctx->input(first);
    if (t.dims() != 2) {
      return InvalidArgument("grad must be a matrix, got shape ", t.shape().DebugString());
    }
    grad = t.flat<float>().data();
    num_rows = t.dim_size(0);
    dim = t.dim_size(1);
    return absl::OkStatus();
  }
  // Nothing to check per row (and the matrix may be in device memory).
  Status CheckRows(OpKernelContext* /*ctx*/, int64_t /*n*/, const Tensor* /*grad_rows*/) const {
    return absl::OkStatus();
  }
  template <int kDim = 0>
  __attribute__((always_inline)) const float* Row(int64_t g, float* /*scratch*/) const {
    return grad + g * dim;
  }
};

// ... or bags (four inputs), summed into `scratch`.
struct BagGradientRows {
  static constexpr int kNumInputs = 4;
  BagGradients<float> bags;
  int64_t num_rows = 0;
  int64_t dim = 0;
  Status Read(OpKernelContext* ctx, int first) {
    TF_RETURN_IF_ERROR(ReadBagGradients(ctx->input(first), ctx->input(first + 1),
                                        ctx->input(first + 2), ctx->input(first + 3),
                                        &bags));
    num_rows = bags.num_rows;
    dim = bags.dim;
    return absl::OkStatus();
  }
  // Checks the bag entries of the n rows an update reads: row i's are
  // segment grad_rows[i] (i without grad_rows). Host memory (CPU only).
  Status CheckRows(OpKernelContext* ctx, int64_t n, const Tensor* grad_rows) const {
    Tensor narrowed;
    const int32_t* rows = nullptr;
    if (grad_rows) TF_RETURN_IF_ERROR(Int32View(ctx, *grad_rows, &narrowed, &rows));
    for (int64_t i = 0; i < n; ++i) TF_RETURN_IF_ERROR(bags.CheckRow(rows ? rows[i] : i));
    return absl::OkStatus();
  }
  // Always inlined, so the sum is compiled with UpdateRows' instruction set.
  template <int kDim = 0>
  __attribute__((always_inline)) const float* Row(int64_t g, float* scratch) const {
    bags.template Row<kDim>(g, scratch);
    return scratch;
  }
};

// The lowest offending positions of a sparse update's indices and
// grad_rows, -1 where none: an index out of [0, num_rows), an index that
// repeats an earlier one (and that one), a grad_rows entry out of range.
struct UpdateRowErrors {
  int64_t out_of_range = -1;
  int64_t repeat = -1;
  int64_t first = -1;
  int64_t grad_row = -1;
};

namespace functor {

// Checks an update's indices against the table's rows and grad_rows (null:
// none) against the gradient's.
#define TFDE_FIND_BAD_UPDATE_ROWS_SIGNATURE                                         \
  Status operator()(OpKernelContext* ctx, const Tensor& indices, int64_t num_rows,  \
                    const Tensor* grad_rows, int64_t grad_num_rows,                 \
                    UpdateRowErrors* errors) const
// Applies Update to the rows `indices` of the variables (the table, then its
// slots), row i's gradient being grads' row grad_rows[i] (null: row i).
#define TFDE_SPARSE_APPLY_SIGNATURE                                                    \
  Status operator()(OpKernelContext* ctx, const typename Update::Params& params,       \
                    LockedVariables* vars, const Tensor& indices, const Gradients& grads, \
                    const Tensor* grad_rows) const

template <typename Device, typename Index>
struct FindBadUpdateRows;
template <typename Device, typename Index, typename Update, typename Gradients>
struct SparseApply;

// Defined in sparse_optimizer_ops.cc.
template <typename Index>
struct FindBadUpdateRows<CPUDevice, Index> {
  TFDE_FIND_BAD_UPDATE_ROWS_SIGNATURE;
};
template <typename Index, typename Update, typename Gradients>
struct SparseApply<CPUDevice, Index, Update, Gradients> {
  TFDE_SPARSE_APPLY_SIGNATURE;
};

#if GOOGLE_CUDA
// Defined in cuda/gpu_functors.cc: a gradient matrix and int32 grad_rows.
template <typename Index>
struct FindBadUpdateRows<GPUDevice, Index> {
  TFDE_FIND_BAD_UPDATE_ROWS_SIGNATURE;
};
template <typename Index, typename Update>
struct SparseApply<GPUDevice, Index, Update, DenseGradients> {
  using Gradients = DenseGradients;
  TFDE_SPARSE_APPLY_SIGNATURE;
};
#endif  // GOOGLE_CUDA

}  // namespace functor

// An update's row errors as the ops' InvalidArgument, written once for
// every device.
template <typename Device, typename Index>
Status UpdateRowsStatus(OpKernelContext* ctx, const Tensor& indices, int64_t num_rows,
                        const Tensor& grad_rows, int64_t grad_num_rows,
                        const UpdateRowErrors& bad, const char* what = "indices") {
  const auto index = [&](int64_t i) {
    return functor::ReadElement<Device, Index>()(ctx, indices, i);
  };
  if (bad.grad_row >= 0) {
    const int64_t value =
        grad_rows.dtype() == tensorflow::DT_INT64
            ? functor::ReadElement<Device, int64_t>()(ctx, grad_rows, bad.grad_row)
            : functor::ReadElement<Device, int32_t>()(ctx, grad_rows, bad.grad_row);
    return InvalidArgument("grad_rows[", bad.grad_row, "] = ", value, " is out of range [0, ",
                           IndexBound(grad_num_rows), ")");
  }
  if (bad.out_of_range >= 0) {
    return InvalidArgument(what, "[", bad.out_of_range, "] = ", index(bad.out_of_range),
                           " is out of range [0, ", num_rows, ")");
  }
  if (bad.repeat >= 0) {
    return InvalidArgument(what, "[", bad.repeat, "] = ", index(bad.repeat), " repeats ", what,
                           "[", bad.first, "]; sum the gradients of a row before applying them");
  }
  return absl::OkStatus();
}

}  // namespace tfde

#endif  // TFDE_KERNELS_SPARSE_APPLY_FUNCTOR_H_
