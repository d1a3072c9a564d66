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

#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "input_checks.h"
#include "sparse_updates.h"
#include "variables.h"

namespace tfde {

// grad_rows[k] is the row of grad that belongs to indices[k]; an empty
// grad_rows means row k. It lets a caller update several tables from one
// gradient matrix without copying it apart.
#define TFDE_SPARSE_APPLY_COMMON_INPUTS \
  .Input("indices: Tindices")            \
  .Input("grad: float")                  \
  .Input("grad_rows: int32")

REGISTER_OP("TfdeSparseApplySgd")
    // Writes its variables: never pruned, never reordered past their reads.
    .SetIsStateful()
    .Input("var: resource")
    TFDE_SPARSE_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle s;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &s));
      return absl::OkStatus();
    })
    .Doc("var[indices] -= learning_rate * grad.");

REGISTER_OP("TfdeSparseApplyAdagrad")
    // Writes its variables: never pruned, never reordered past their reads.
    .SetIsStateful()
    .Input("var: resource")
    .Input("accumulator: resource")
    TFDE_SPARSE_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Input("epsilon: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle s;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &s));
      for (int i = 5; i < 7; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &s));
      return absl::OkStatus();
    })
    .Doc(R"doc(
accumulator[i] += grad^2; var[i] -= lr * grad / sqrt(accumulator[i] + epsilon)
for each i in indices (Keras 3 Adagrad).
)doc");

REGISTER_OP("TfdeSparseApplyLazyAdam")
    // Writes its variables: never pruned, never reordered past their reads.
    .SetIsStateful()
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    TFDE_SPARSE_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Input("beta_1: float")
    .Input("beta_2: float")
    .Input("epsilon: float")
    .Input("step: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle s;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &s));
      for (int i = 6; i < 11; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &s));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Keras 3 Adam on the given rows only ("lazy"): m, v and var change for those
rows; `step` is the 1-based step count used for bias correction.
)doc");

REGISTER_OP("TfdeSparseApplyFtrl")
    // Writes its variables: never pruned, never reordered past their reads.
    .SetIsStateful()
    .Input("var: resource")
    .Input("accumulator: resource")
    .Input("linear: resource")
    TFDE_SPARSE_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Input("l1: float")
    .Input("l2: float")
    .Input("l2_shrinkage: float")
    .Input("beta: float")
    .Input("learning_rate_power: float")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle s;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &s));
      for (int i = 6; i < 12; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &s));
      return absl::OkStatus();
    })
    .Doc("Keras 3 FTRL on the given rows only.");

#undef TFDE_SPARSE_APPLY_COMMON_INPUTS

// One kernel for all sparse updates: validation, locking, and a parallel
// loop over the rows. `Update` supplies the number of variables, a Params
// struct read from the scalar inputs in each Compute (kernels run
// concurrently, so nothing per-call is stored in the kernel), and the
// per-row formula.
template <typename Index, typename Update>
class SparseApplyOp : public OpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    constexpr int kNumVars = Update::kNumVars;
    typename Update::Params params;
    OP_REQUIRES_OK(ctx, Update::ReadParams(ctx, kNumVars + 3, &params));
    const Tensor& indices_t = ctx->input(kNumVars);
    const Tensor& grad_t = ctx->input(kNumVars + 1);
    const Tensor& grad_rows_t = ctx->input(kNumVars + 2);
    bool select;
    OP_REQUIRES_OK(ctx, CheckUpdateInputs(indices_t, grad_t, grad_rows_t, "indices", &select));
    OP_REQUIRES_OK(ctx, CheckGradRowsRange(grad_rows_t, grad_t.dim_size(0)));
    const int64_t n = indices_t.NumElements();
    const int32_t* grad_rows = select ? grad_rows_t.flat<int32_t>().data() : nullptr;

    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Acquire(ctx, 0, kNumVars, LockMode::kExclusive));
    OP_REQUIRES_OK(ctx, vars.CheckUpdateTargets(ctx, 0, grad_t));
    const int64_t dim = vars.dim();
    const int64_t num_rows = vars.num_rows();
    const Index* indices = indices_t.flat<Index>().data();
    IdIndexMap<Index> seen(n);
    for (int64_t i = 0; i < n; ++i) {
      const Index row = indices[i];
      OP_REQUIRES(ctx, row >= 0 && row < num_rows,
                  InvalidArgument("indices[", i, "] = ", row,
                                  " is out of range [0, ", num_rows, ")"));
      bool inserted;
      const int32_t first =
          seen.FindOrInsert(row, static_cast<int32_t>(i), &inserted);
      OP_REQUIRES(ctx, inserted,
                  InvalidArgument("indices[", i, "] = ", row,
                                  " repeats indices[", first,
                                  "]; sum the gradients of a row before "
                                  "applying them"));
    }
    OP_REQUIRES_OK(ctx, vars.MakeWritable(ctx));

    float* slots[kNumVars];
    for (int v = 0; v < kNumVars; ++v) slots[v] = vars.Rows(v);
    const float* grad = grad_t.flat<float>().data();
    const auto rows_of = [&](int64_t i, float** rows) {
      const int64_t offset = static_cast<int64_t>(indices[i]) * dim;
      for (int v = 0; v < kNumVars; ++v) rows[v] = slots[v] + offset;
      return true;
    };
    ParallelFor(ctx, n, dim * 12, [&](int64_t i0, int64_t i1) {
      UpdateRows<Update>(params, i0, i1, dim, grad, grad_rows, rows_of);
    });
  }
};

#define REGISTER_SPARSE_APPLY(op_name, Update)                          \
  REGISTER_KERNEL_BUILDER(Name(op_name)                                 \
                              .Device(DEVICE_CPU)                       \
                              .HostMemory("learning_rate")              \
                              .TypeConstraint<int32_t>("Tindices"),     \
                          SparseApplyOp<int32_t, Update>);              \
  REGISTER_KERNEL_BUILDER(Name(op_name)                                 \
                              .Device(DEVICE_CPU)                       \
                              .HostMemory("learning_rate")              \
                              .TypeConstraint<int64_t>("Tindices"),     \
                          SparseApplyOp<int64_t, Update>);
REGISTER_SPARSE_APPLY("TfdeSparseApplySgd", SgdUpdate);
REGISTER_SPARSE_APPLY("TfdeSparseApplyAdagrad", AdagradUpdate);
REGISTER_SPARSE_APPLY("TfdeSparseApplyLazyAdam", LazyAdamUpdate);
REGISTER_SPARSE_APPLY("TfdeSparseApplyFtrl", FtrlUpdate);
#undef REGISTER_SPARSE_APPLY

}  // namespace tfde
