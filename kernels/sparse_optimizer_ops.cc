// Sparse optimizer updates applied in place to the touched rows of a table
// and of its slot variables: SGD, Adagrad, lazy Adam and FTRL.
//
// The formulas are Keras 3's (keras.optimizers.*.update_step) restricted
// to the given rows. Every index is validated (in range, not repeated)
// before the first write, so bad input never leaves a table half-updated.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bag_gradients.h"
#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "input_checks.h"
#include "sparse_updates.h"
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
#undef TFDE_LAZY_ADAM_VARS
#undef TFDE_LAZY_ADAM_SCALARS
#undef TFDE_FTRL_VARS
#undef TFDE_FTRL_SCALARS
#undef TFDE_DENSE_GRAD_INPUTS
#undef TFDE_BAG_GRAD_INPUTS

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
  Status CheckRow(int64_t /*g*/) const { return absl::OkStatus(); }
  const float* Row(int64_t g, float* /*scratch*/) const { return grad + g * dim; }
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
  Status CheckRow(int64_t g) const { return bags.CheckRow(g); }
  const float* Row(int64_t g, float* scratch) const {
    bags.Row(g, scratch);
    return scratch;
  }
};

// One kernel for all sparse updates: validation, locking, and a parallel
// loop over the rows. `Update` supplies the number of variables, a Params
// struct read from the scalar inputs in each Compute (kernels run
// concurrently, so nothing per-call is stored in the kernel), and the
// per-row formula; `Gradients` where each row's gradient comes from.
template <typename Index, typename Update, typename Gradients>
class SparseApplyOp : public OpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    constexpr int kNumVars = Update::kNumVars;
    constexpr int kGradRowsInput = kNumVars + 1 + Gradients::kNumInputs;
    typename Update::Params params;
    OP_REQUIRES_OK(ctx, Update::ReadParams(ctx, kGradRowsInput + 1, &params));
    const Tensor& indices_t = ctx->input(kNumVars);
    const Tensor& grad_rows_t = ctx->input(kGradRowsInput);
    Gradients grads;
    OP_REQUIRES_OK(ctx, grads.Read(ctx, kNumVars + 1));
    bool select;
    OP_REQUIRES_OK(ctx, CheckUpdateInputs(indices_t, grads.num_rows, grad_rows_t, "indices",
                                          &select));
    Int32Indices grad_rows_32;
    OP_REQUIRES_OK(ctx, ReadIndices(ctx, grad_rows_t, "grad_rows", grads.num_rows,
                                    &grad_rows_32));
    const int64_t n = indices_t.NumElements();
    const int32_t* grad_rows = select ? grad_rows_32.data : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES_OK(ctx, grads.CheckRow(grad_rows ? grad_rows[i] : i));
    }

    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Acquire(ctx, 0, kNumVars, LockMode::kExclusive));
    OP_REQUIRES_OK(ctx, vars.CheckUpdateTargets(ctx, 0, grads.dim));
    const int64_t dim = vars.dim();
    const int64_t num_rows = vars.num_rows();
    const Index* indices = indices_t.flat<Index>().data();
    OP_REQUIRES_OK(ctx, CheckUpdateRows(indices, n, num_rows));
    OP_REQUIRES_OK(ctx, vars.MakeWritable(ctx));

    float* slots[kNumVars];
    for (int v = 0; v < kNumVars; ++v) slots[v] = vars.Rows(v);
    const auto rows_of = [&](int64_t i, float** rows) {
      const int64_t offset = static_cast<int64_t>(indices[i]) * dim;
      for (int v = 0; v < kNumVars; ++v) rows[v] = slots[v] + offset;
      return true;
    };
    const auto grad_of = [&](int64_t i, float* scratch) {
      return grads.Row(grad_rows ? grad_rows[i] : i, scratch);
    };
    ParallelFor(ctx, n, dim * 12, [&](int64_t i0, int64_t i1) {
      UpdateRows<Update>(params, i0, i1, dim, grad_of, rows_of);
    });
  }
};

#define REGISTER_SPARSE_APPLY_FOR(op_name, Index, Update, Gradients)     \
  REGISTER_KERNEL_BUILDER(Name(op_name)                                   \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<Index>("Tindices"),         \
                          SparseApplyOp<Index, Update, Gradients>);
#define REGISTER_SPARSE_APPLY(kind, Update)                                           \
  REGISTER_SPARSE_APPLY_FOR("TfdeSparseApply" kind, int32_t, Update, DenseGradients)  \
  REGISTER_SPARSE_APPLY_FOR("TfdeSparseApply" kind, int64_t, Update, DenseGradients)  \
  REGISTER_SPARSE_APPLY_FOR("TfdeSparseApply" kind "FromBags", int32_t, Update,       \
                            BagGradientRows)                                          \
  REGISTER_SPARSE_APPLY_FOR("TfdeSparseApply" kind "FromBags", int64_t, Update,       \
                            BagGradientRows)
REGISTER_SPARSE_APPLY("Sgd", SgdUpdate);
REGISTER_SPARSE_APPLY("Adagrad", AdagradUpdate);
REGISTER_SPARSE_APPLY("LazyAdam", LazyAdamUpdate);
REGISTER_SPARSE_APPLY("Ftrl", FtrlUpdate);
#undef REGISTER_SPARSE_APPLY_FOR
#undef REGISTER_SPARSE_APPLY

}  // namespace tfde
