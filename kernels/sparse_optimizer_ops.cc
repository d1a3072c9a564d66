// Sparse optimizer updates applied in place to the touched rows of a table
// and of its slot variables: SGD, Adagrad, row-wise Adagrad, lazy Adam and
// FTRL.
//
// The formulas are Keras 3's (keras.optimizers.*.update_step) restricted
// to the given rows. Every index is validated (in range, not repeated)
// before the first write, so bad input never leaves a table half-updated.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bag_gradients.h"
#include "common.h"
#include "input_checks.h"
#include "sparse_apply_functor.h"
#include "sparse_updates.h"
#include "tensorflow/core/framework/op.h"
#include "variables.h"

namespace tfde {

// Each optimizer has two ops that differ only in how the gradient arrives:
//  - TfdeSparseApply<Kind>: a [k, dim] matrix `grad`;
//  - TfdeSparseApply<Kind>FromBags: the lookup's output gradient and the
//    ids of each row (bag_gradients.h), summed row by row inside the update,
//    so no gradient matrix is written (the fused backward of a lookup whose
//    rows are all local).
// grad_rows[k] is the gradient row (or bag-gradient segment) that belongs
// to indices[k]; an empty grad_rows means k. It lets a caller update several
// tables from one gradient without copying it apart.
#define TFDE_DENSE_GRAD_INPUTS .Input("grad: float")
#define TFDE_BAG_GRAD_INPUTS          \
  .Input("output_grad: float")        \
  .Input("segments: int64")           \
  .Input("bags: int32")               \
  .Input("bag_weights: float")

// Ranks: indices, the gradient inputs, grad_rows, then the scalars.
Status SparseApplyShape(shape_inference::InferenceContext* c, int num_vars,
                        bool from_bags, int num_scalars) {
  shape_inference::ShapeHandle s;
  int i = num_vars;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(i++), 1, &s));  // indices
  TF_RETURN_IF_ERROR(c->WithRank(c->input(i++), 2, &s));  // grad / output_grad
  if (from_bags) {
    for (int k = 0; k < 3; ++k) TF_RETURN_IF_ERROR(c->WithRank(c->input(i++), 1, &s));
  }
  TF_RETURN_IF_ERROR(c->WithRank(c->input(i++), 1, &s));  // grad_rows
  for (int k = 0; k < num_scalars; ++k) TF_RETURN_IF_ERROR(c->WithRank(c->input(i++), 0, &s));
  return absl::OkStatus();
}

#define TFDE_SGD_VARS .Input("var: resource")
#define TFDE_SGD_SCALARS .Input("learning_rate: float")
#define TFDE_ADAGRAD_VARS .Input("var: resource").Input("accumulator: resource")
#define TFDE_ADAGRAD_SCALARS .Input("learning_rate: float").Input("epsilon: float")
#define TFDE_ROWWISE_ADAGRAD_VARS .Input("var: resource").Input("row_accumulator: resource")
#define TFDE_LAZY_ADAM_VARS \
  .Input("var: resource").Input("m: resource").Input("v: resource")
#define TFDE_LAZY_ADAM_SCALARS                                            \
  .Input("learning_rate: float").Input("beta_1: float").Input("beta_2: float") \
  .Input("epsilon: float").Input("step: float")
#define TFDE_FTRL_VARS \
  .Input("var: resource").Input("accumulator: resource").Input("linear: resource")
#define TFDE_FTRL_SCALARS                                                 \
  .Input("learning_rate: float").Input("l1: float").Input("l2: float")    \
  .Input("l2_shrinkage: float").Input("beta: float")                      \
  .Input("learning_rate_power: float")

// copy_on_read says who pays for a read that shares the table's buffer. True
// (TF's choice for sparsely updated variables): the update puts the variable
// in copy-on-read mode, so every later whole-variable read copies it, and
// gathers read it in place. False, for tables read whole each step (a DTensor
// mesh's, whose gathers lower to a read): reads share the buffer, and an
// update copies it only while such a read still holds it. False leaves the
// variable's mode as it is: once anything (a True update, a ResourceGather,
// TF's sparse ops) has set copy-on-read mode, TF never clears it.
#define TFDE_REGISTER_SPARSE_APPLY_OP(name, VARS, GRAD_INPUTS, SCALARS, num_vars, \
                                      from_bags, num_scalars, doc)               \
  REGISTER_OP(name)                                                              \
      /* Writes its variables: never pruned, never reordered past reads. */      \
      .SetIsStateful()                                                           \
      VARS                                                                       \
      .Input("indices: Tindices")                                                \
      GRAD_INPUTS                                                                \
      .Input("grad_rows: Tgrad_rows")                                            \
      SCALARS                                                                    \
      .Attr("Tindices: {int32, int64}")                                          \
      .Attr("Tgrad_rows: {int32, int64} = DT_INT32")                             \
      .Attr("copy_on_read: bool = true")                                         \
      .SetShapeFn([](shape_inference::InferenceContext* c) {                     \
        return SparseApplyShape(c, num_vars, from_bags, num_scalars);            \
      })                                                                         \
      .Doc(doc)

#define TFDE_REGISTER_SPARSE_APPLY_OPS(kind, VARS, SCALARS, num_vars, num_scalars, doc) \
  TFDE_REGISTER_SPARSE_APPLY_OP("TfdeSparseApply" kind, VARS, TFDE_DENSE_GRAD_INPUTS,  \
                                SCALARS, num_vars, false, num_scalars, doc);           \
  TFDE_REGISTER_SPARSE_APPLY_OP("TfdeSparseApply" kind "FromBags", VARS,               \
                                TFDE_BAG_GRAD_INPUTS, SCALARS, num_vars, true,         \
                                num_scalars, doc " The gradient comes as bags.")

TFDE_REGISTER_SPARSE_APPLY_OPS("Sgd", TFDE_SGD_VARS, TFDE_SGD_SCALARS, 1, 1,
                               "var[indices] -= learning_rate * grad.");
TFDE_REGISTER_SPARSE_APPLY_OPS(
    "Adagrad", TFDE_ADAGRAD_VARS, TFDE_ADAGRAD_SCALARS, 2, 2,
    "accumulator[i] += grad^2; var[i] -= lr * grad / sqrt(accumulator[i] + "
    "epsilon) for each i in indices (Keras 3 Adagrad).");
TFDE_REGISTER_SPARSE_APPLY_OPS(
    "RowwiseAdagrad", TFDE_ROWWISE_ADAGRAD_VARS, TFDE_ADAGRAD_SCALARS, 2, 2,
    "row_accumulator[i] (shape [rows, 1]) += mean(grad^2 over the row); "
    "var[i] -= grad * lr / (sqrt(row_accumulator[i]) + epsilon) for each i in "
    "indices (FBGEMM's EXACT_ROWWISE_ADAGRAD).");
TFDE_REGISTER_SPARSE_APPLY_OPS(
    "LazyAdam", TFDE_LAZY_ADAM_VARS, TFDE_LAZY_ADAM_SCALARS, 3, 5,
    "Keras 3 Adam on the given rows only (lazy): m, v and var change for those "
    "rows; `step` is the 1-based step count used for bias correction.");
TFDE_REGISTER_SPARSE_APPLY_OPS("Ftrl", TFDE_FTRL_VARS, TFDE_FTRL_SCALARS, 3, 6,
                               "Keras 3 FTRL on the given rows only.");

#undef TFDE_REGISTER_SPARSE_APPLY_OPS
#undef TFDE_REGISTER_SPARSE_APPLY_OP
#undef TFDE_SGD_VARS
#undef TFDE_SGD_SCALARS
#undef TFDE_ADAGRAD_VARS
#undef TFDE_ADAGRAD_SCALARS
#undef TFDE_ROWWISE_ADAGRAD_VARS
#undef TFDE_LAZY_ADAM_VARS
#undef TFDE_LAZY_ADAM_SCALARS
#undef TFDE_FTRL_VARS
#undef TFDE_FTRL_SCALARS
#undef TFDE_DENSE_GRAD_INPUTS
#undef TFDE_BAG_GRAD_INPUTS

// One op class for all sparse updates: validation, locking, and the
// functor's loop over the rows. `Update` supplies the number of variables, a
// Params struct read from the scalar inputs in each Compute (kernels run
// concurrently, so nothing per call is stored in the kernel), and the
// per-row formula; `Gradients` where each row's gradient comes from.
template <typename Device, typename Index, typename Update, typename Gradients>
class SparseApplyOp : public OpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("copy_on_read", &copy_on_read_));
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr int kNumVars = Update::kNumVars;
    constexpr int kGradRowsInput = kNumVars + 1 + Gradients::kNumInputs;
    typename Update::Params params;
    OP_REQUIRES_OK(ctx, Update::ReadParams(ctx, kGradRowsInput + 1, &params));
    const Tensor& indices = ctx->input(kNumVars);
    const Tensor& grad_rows = ctx->input(kGradRowsInput);
    Gradients grads;
    OP_REQUIRES_OK(ctx, grads.Read(ctx, kNumVars + 1));
    bool select;
    OP_REQUIRES_OK(ctx, CheckUpdateInputs(indices, grads.num_rows, grad_rows, "indices",
                                          &select));
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Acquire(ctx, 0, kNumVars, LockMode::kExclusive));
    OP_REQUIRES_OK(ctx, vars.CheckUpdateTargets(ctx, 0, grads.dim, Update::kSlotWidth));
    UpdateRowErrors bad;
    OP_REQUIRES_OK(ctx, functor::FindBadUpdateRows<Device, Index>()(
                            ctx, indices, vars.num_rows(), &grad_rows, grads.num_rows, &bad));
    OP_REQUIRES_OK(ctx, (UpdateRowsStatus<Device, Index>(ctx, indices, vars.num_rows(),
                                                         grad_rows, grads.num_rows, bad)));
    OP_REQUIRES_OK(ctx, grads.CheckRows(ctx, indices.NumElements(),
                                        select ? &grad_rows : nullptr));
    OP_REQUIRES_OK(ctx, vars.MakeWritable(ctx, copy_on_read_,
                                          [ctx](const Tensor& from, Tensor* to) {
                                            functor::CopyBuffer<Device>()(ctx, from, to);
                                          }));
    OP_REQUIRES_OK(ctx, (functor::SparseApply<Device, Index, Update, Gradients>()(
                            ctx, params, &vars, indices, grads, select ? &grad_rows : nullptr)));
  }

 private:
  bool copy_on_read_;
};

// ---- CPU functors

// Each index in [0, num_rows) and none repeated, and grad_rows in range. A
// bitmap of the table's rows is cheaper than a hash map while the table is
// not much larger than the batch (the usual case); a huge table with few
// rows gets the hash map.
template <typename Index>
Status functor::FindBadUpdateRows<CPUDevice, Index>::operator()(
    OpKernelContext* ctx, const Tensor& indices_t, int64_t num_rows, const Tensor* grad_rows,
    int64_t grad_num_rows, UpdateRowErrors* bad) const {
  if (grad_rows) {
    TF_RETURN_IF_ERROR(grad_rows->dtype() == tensorflow::DT_INT64
                           ? FindOutOfRange<CPUDevice, int64_t>()(
                                 ctx, *grad_rows, 0, IndexBound(grad_num_rows), &bad->grad_row)
                           : FindOutOfRange<CPUDevice, int32_t>()(
                                 ctx, *grad_rows, 0, IndexBound(grad_num_rows), &bad->grad_row));
    if (bad->grad_row >= 0) return absl::OkStatus();
  }
  const Index* indices = indices_t.flat<Index>().data();
  const int64_t n = indices_t.NumElements();
  if (num_rows <= 256 * n) {
    std::vector<uint64_t> seen((num_rows + 63) / 64, 0);
    for (int64_t i = 0; i < n; ++i) {
      const Index row = indices[i];
      if (row < 0 || row >= num_rows) {
        bad->out_of_range = i;
        return absl::OkStatus();
      }
      uint64_t& word = seen[row >> 6];
      const uint64_t bit = uint64_t{1} << (row & 63);
      if (word & bit) {
        int64_t first = 0;
        while (indices[first] != row) ++first;
        bad->repeat = i;
        bad->first = first;
        return absl::OkStatus();
      }
      word |= bit;
    }
    return absl::OkStatus();
  }
  IdIndexMap<Index> seen(n);
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= num_rows) {
      bad->out_of_range = i;
      return absl::OkStatus();
    }
    bool inserted;
    const int32_t first = seen.FindOrInsert(indices[i], static_cast<int32_t>(i), &inserted);
    if (!inserted) {
      bad->repeat = i;
      bad->first = first;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

template <typename Index, typename Update, typename Gradients>
Status functor::SparseApply<CPUDevice, Index, Update, Gradients>::operator()(
    OpKernelContext* ctx, const typename Update::Params& params, LockedVariables* vars,
    const Tensor& indices_t, const Gradients& grads, const Tensor* grad_rows_t) const {
  constexpr int kNumVars = Update::kNumVars;
  const int64_t n = indices_t.NumElements();
  const int64_t dim = vars->dim();
  const Index* indices = indices_t.flat<Index>().data();
  Tensor narrowed;
  const int32_t* grad_rows = nullptr;
  if (grad_rows_t) TF_RETURN_IF_ERROR(Int32View(ctx, *grad_rows_t, &narrowed, &grad_rows));
  float* slots[kNumVars];
  for (int v = 0; v < kNumVars; ++v) slots[v] = vars->Rows(v);
  const int64_t slot_width = SlotWidth<Update>(dim);
  const auto rows_of = [&](int64_t i, float** rows) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    rows[0] = slots[0] + row * dim;
    for (int v = 1; v < kNumVars; ++v) rows[v] = slots[v] + row * slot_width;
    return true;
  };
  WithCompiledWidth(dim, [&](auto width) {
    constexpr int kDim = decltype(width)::value;
    // Inlined, so the row's sum is compiled with UpdateRows' instruction set.
    const auto grad_of = [&](int64_t i, float* scratch) __attribute__((always_inline)) {
      return grads.template Row<kDim>(grad_rows ? grad_rows[i] : i, scratch);
    };
    ParallelFor(ctx, n, dim * 12, [&](int64_t i0, int64_t i1) {
      UpdateRows<Update, kDim>(params, i0, i1, dim, grad_of, rows_of);
    });
  });
  return absl::OkStatus();
}

// ---- registration: on the GPU, the scalars are read on the host, and the
// launchers take a gradient matrix and int32 grad_rows.

#define REGISTER_SPARSE_APPLY_FOR(DEV, op_name, Index, Update, Gradients, ...) \
  REGISTER_KERNEL_BUILDER(Name(op_name)                                         \
                              .Device(DEVICE_##DEV)                             \
                              .TypeConstraint<Index>("Tindices") __VA_ARGS__,   \
                          SparseApplyOp<DEV##Device, Index, Update, Gradients>);
#define REGISTER_SPARSE_APPLY(kind, Update)                                              \
  REGISTER_SPARSE_APPLY_FOR(CPU, "TfdeSparseApply" kind, int32_t, Update, DenseGradients) \
  REGISTER_SPARSE_APPLY_FOR(CPU, "TfdeSparseApply" kind, int64_t, Update, DenseGradients) \
  REGISTER_SPARSE_APPLY_FOR(CPU, "TfdeSparseApply" kind "FromBags", int32_t, Update,     \
                            BagGradientRows)                                             \
  REGISTER_SPARSE_APPLY_FOR(CPU, "TfdeSparseApply" kind "FromBags", int64_t, Update,     \
                            BagGradientRows)
REGISTER_SPARSE_APPLY("Sgd", SgdUpdate);
REGISTER_SPARSE_APPLY("Adagrad", AdagradUpdate);
REGISTER_SPARSE_APPLY("RowwiseAdagrad", RowwiseAdagradUpdate);
REGISTER_SPARSE_APPLY("LazyAdam", LazyAdamUpdate);
REGISTER_SPARSE_APPLY("Ftrl", FtrlUpdate);
#undef REGISTER_SPARSE_APPLY

#if GOOGLE_CUDA
#define REGISTER_GPU_SPARSE_APPLY(kind, Update, HOST_SCALARS)                             \
  REGISTER_SPARSE_APPLY_FOR(GPU, "TfdeSparseApply" kind, int32_t, Update, DenseGradients, \
                            .HostMemory("learning_rate") HOST_SCALARS                    \
                            .TypeConstraint<int32_t>("Tgrad_rows"))                      \
  REGISTER_SPARSE_APPLY_FOR(GPU, "TfdeSparseApply" kind, int64_t, Update, DenseGradients, \
                            .HostMemory("learning_rate") HOST_SCALARS                    \
                            .TypeConstraint<int32_t>("Tgrad_rows"))
REGISTER_GPU_SPARSE_APPLY("Sgd", SgdUpdate, )
REGISTER_GPU_SPARSE_APPLY("Adagrad", AdagradUpdate, .HostMemory("epsilon"))
REGISTER_GPU_SPARSE_APPLY("LazyAdam", LazyAdamUpdate,
                          .HostMemory("beta_1").HostMemory("beta_2").HostMemory("epsilon")
                          .HostMemory("step"))
REGISTER_GPU_SPARSE_APPLY("Ftrl", FtrlUpdate,
                          .HostMemory("l1").HostMemory("l2").HostMemory("l2_shrinkage")
                          .HostMemory("beta").HostMemory("learning_rate_power"))
#undef REGISTER_GPU_SPARSE_APPLY
#endif  // GOOGLE_CUDA
#undef REGISTER_SPARSE_APPLY_FOR

}  // namespace tfde
