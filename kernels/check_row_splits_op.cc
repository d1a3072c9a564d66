// TfdeCheckRowSplits: a ragged input's row splits checked before anything
// reads samples from them (a RaggedTensor built with validate=False holds
// any): they start at 0, never decrease and end at the number of ids;
// otherwise an InvalidArgument that names the feature and table (the `what`
// attribute) and the first bad split. No output: callers hold what reads
// the splits on it, as on an Assert. One serial scan of the [batch + 1]
// splits, where the pure-TF twin (tfde/ops/reference.py) builds four
// slices, four comparisons, three reductions and an Assert per feature.
//
// The splits are read in host memory on every device (a GPU's are copied,
// as an Assert's condition is): a batch's splits are small, and the check
// must answer on the host before the step goes on.

#include <cstdint>
#include <string>

#include "common.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfde {

REGISTER_OP("TfdeCheckRowSplits")
    .Input("row_splits: Tsplits")
    .Input("num_ids: int64")
    .Attr("Tsplits: {int32, int64}")
    .Attr("what: string")
    .SetIsStateful()  // as an Assert: never pruned, merged or folded away
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      return c->WithRank(c->input(1), 0, &unused);
    })
    .Doc(R"doc(
Fails unless `row_splits` start at 0, never decrease and end at `num_ids`.

what: the splits' owner for the error, e.g. "feature f (table t)". The error
  reads "<what>: ragged ids have row splits that do not start at 0, never
  decrease and end at the number of ids: <the first bad split>".
)doc");

template <typename Split>
class CheckRowSplitsOp : public OpKernel {
 public:
  explicit CheckRowSplitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("what", &what_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t num_ids;
    OP_REQUIRES_OK(ctx, ReadIndexScalar(ctx->input(1), "num_ids", &num_ids));
    OP_REQUIRES_OK(ctx, CheckRowSplitsOver<Split>(ctx->input(0), num_ids, what_));
  }

 private:
  std::string what_;
};

#define REGISTER_CHECK(DEV, Split)                              \
  REGISTER_KERNEL_BUILDER(Name("TfdeCheckRowSplits")            \
                              .Device(DEVICE_##DEV)             \
                              .HostMemory("row_splits")         \
                              .HostMemory("num_ids")            \
                              .TypeConstraint<Split>("Tsplits"), \
                          CheckRowSplitsOp<Split>);
REGISTER_CHECK(CPU, int32_t);
REGISTER_CHECK(CPU, int64_t);
#if GOOGLE_CUDA
REGISTER_CHECK(GPU, int32_t);
REGISTER_CHECK(GPU, int64_t);
#endif
#undef REGISTER_CHECK

}  // namespace tfde
