// TfdeCheckIdRange: a feature's ids, passed through once every one lies in
// its table's rows [0, vocabulary_size); otherwise an InvalidArgument that
// names the feature and table (the `what` attribute), the first bad id and
// its position. One scan on the ids' device, where the pure-TF twin
// (tfde/ops/reference.py) builds a mask, a position vector, a minimum and a
// gather per feature.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <limits>
#include <string>

#include "common.h"
#include "device.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfde {

REGISTER_OP("TfdeCheckIdRange")
    .Input("ids: T")
    .Output("checked_ids: T")
    .Attr("T: {int32, int64}")
    .Attr("vocabulary_size: int")
    .Attr("what: string")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      c->set_output(0, ids);
      return absl::OkStatus();
    })
    .Doc(R"doc(
`ids` unchanged (the same buffer) when every id lies in [0, vocabulary_size).

what: the ids' owner for the error, e.g. "feature f (table t)". The error
  reads "<what>: id <value> at position <i> is out of range [0, <size>)",
  for the first such id.
)doc");

template <typename Device, typename Id>
class CheckIdRangeOp : public OpKernel {
 public:
  explicit CheckIdRangeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("vocabulary_size", &vocabulary_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("what", &what_));
    // INT64_MAX is FindOutOfRange's "unbounded": no table has that many rows.
    OP_REQUIRES(ctx, vocabulary_size_ >= 0 &&
                         vocabulary_size_ < std::numeric_limits<int64_t>::max(),
                InvalidArgument(what_, ": vocabulary_size must be in [0, 2^63 - 1), got ",
                                vocabulary_size_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                InvalidArgument(what_, ": ids must be a vector, got shape ",
                                ids.shape().DebugString()));
    int64_t bad;
    OP_REQUIRES_OK(ctx, functor::FindOutOfRange<Device, Id>()(ctx, ids, 0, vocabulary_size_,
                                                              &bad));
    OP_REQUIRES(ctx, bad < 0,
                InvalidArgument(what_, ": id ", functor::ReadElement<Device, Id>()(ctx, ids, bad),
                                " at position ", bad, " is out of range [0, ",
                                vocabulary_size_, ")"));
    ctx->set_output(0, ids);
  }

 private:
  int64_t vocabulary_size_;
  std::string what_;
};

#define REGISTER_CHECK(DEV, Id)                                                          \
  REGISTER_KERNEL_BUILDER(Name("TfdeCheckIdRange").Device(DEVICE_##DEV).TypeConstraint<Id>("T"), \
                          CheckIdRangeOp<DEV##Device, Id>);
REGISTER_CHECK(CPU, int32_t);
REGISTER_CHECK(CPU, int64_t);
#if GOOGLE_CUDA
REGISTER_CHECK(GPU, int32_t);
REGISTER_CHECK(GPU, int64_t);
#endif
#undef REGISTER_CHECK

}  // namespace tfde
