// The pooled exchange's keys (tfde/routing.py, route_bags_to_owners): each
// id travels to its owner with its sample inside it, as one int64 key
// `(sample + first_sample) * stride + id`, and the owner takes the ids and
// the samples' row splits back out of the keys it receives.
//
// TfdeSampleKeys: the keys of a replica's ids, given its row splits.
// TfdeSplitSampleKeys: the ids of received keys and their row splits over
//   the global batch, the keys being in increasing sample.
//
// Each is one pass over the ids. In stock ops (the twins,
// tfde/ops/sample_keys_twin.py, and the pipeline before them) the segment
// ids of the splits (tf.repeat), a product and a sum; and a mask, a shift,
// and a bincount and cumsum (or a searchsorted) for the splits: about 0.4
// ms each side for 82k ids, per replica and step
// (a microbenchmark against the twin's ops). CPU only: elsewhere the twins run.

#define EIGEN_USE_THREADS

#include <cstdint>
#include <limits>

#include "common.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfde {

REGISTER_OP("TfdeSampleKeys")
    .Input("ids: int64")
    .Input("row_splits: int64")
    .Input("first_sample: int64")
    .Input("stride: int64")
    .Output("keys: int64")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle ids, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &unused));
      c->set_output(0, ids);
      return absl::OkStatus();
    })
    .Doc(R"doc(
keys[i] = (s + first_sample) * stride + ids[i], where s is the sample (row of
`row_splits`) that ids[i] belongs to.

row_splits: start at 0, never decrease, end at size(ids) (else the error of
  TfdeCheckRowSplits, for "row_splits").
ids: each in [0, stride), so that a key's remainder by stride is its id.
first_sample: this replica's first sample in the global batch, >= 0.
stride: > 0; no key may pass the largest int64.
)doc");

REGISTER_OP("TfdeSplitSampleKeys")
    .Input("keys: int64")
    .Input("num_samples: int64")
    .Output("ids: int64")
    .Output("row_splits: int64")
    .Attr("bits: int >= 0")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle keys, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, keys);
      shape_inference::DimensionHandle samples, splits;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(1, &samples));
      TF_RETURN_IF_ERROR(c->Add(samples, 1, &splits));
      c->set_output(1, c->Vector(splits));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The ids and samples of keys `sample * 2^bits + id` (id below 2^bits), in
increasing sample: ids[i] = keys[i] mod 2^bits, and row_splits ([num_samples
+ 1]) where sample s's ids are ids[row_splits[s]:row_splits[s + 1]].
A key that is negative, or whose sample decreases or is not below
num_samples, is an InvalidArgument naming its position.
)doc");

class SampleKeysOp : public OpKernel {
 public:
  explicit SampleKeysOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    const Tensor& splits_t = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckIdVector(ids_t));
    int64_t first_sample, stride;
    OP_REQUIRES_OK(ctx, ReadInt64Scalar(ctx, 2, "first_sample", &first_sample));
    OP_REQUIRES_OK(ctx, ReadInt64Scalar(ctx, 3, "stride", &stride));
    OP_REQUIRES(ctx, first_sample >= 0,
                InvalidArgument("first_sample must be >= 0, got ", first_sample));
    OP_REQUIRES(ctx, stride > 0, InvalidArgument("stride must be positive, got ", stride));
    const int64_t n = ids_t.NumElements();
    OP_REQUIRES_OK(ctx, CheckRowSplitsOver<int64_t>(splits_t, n, "row_splits"));
    const int64_t samples = splits_t.NumElements() - 1;
    const int64_t* ids = ids_t.flat<int64_t>().data();
    const int64_t* splits = splits_t.flat<int64_t>().data();
    // The largest key, (samples - 1 + first_sample) * stride + stride - 1,
    // must be an int64.
    const int64_t max = std::numeric_limits<int64_t>::max();
    OP_REQUIRES(ctx, samples == 0 || (first_sample <= max / stride - samples),
                InvalidArgument("keys of ", samples, " samples from sample ", first_sample,
                                " at stride ", stride, " pass the largest int64"));
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, ids[i] >= 0 && ids[i] < stride,
                  InvalidArgument("ids[", i, "] = ", ids[i], " is not in [0, stride = ",
                                  stride, ")"));
    }
    Tensor* keys_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids_t.shape(), &keys_t));
    int64_t* keys = keys_t->flat<int64_t>().data();
    const int64_t ids_per_sample = samples > 0 ? n / samples + 1 : 1;
    ParallelFor(ctx, samples, 2 * ids_per_sample, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t base = (s + first_sample) * stride;
        for (int64_t i = splits[s]; i < splits[s + 1]; ++i) keys[i] = base + ids[i];
      }
    });
  }
};

class SplitSampleKeysOp : public OpKernel {
 public:
  explicit SplitSampleKeysOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES(ctx, bits_ < 63, InvalidArgument("bits must be below 63, got ", bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckIdVector(keys_t, "keys"));
    int64_t num_samples;
    OP_REQUIRES_OK(ctx, ReadInt64Scalar(ctx, 1, "num_samples", &num_samples));
    OP_REQUIRES(ctx, num_samples >= 0 && num_samples < std::numeric_limits<int64_t>::max(),
                InvalidArgument("num_samples must be in [0, 2^63 - 1), got ", num_samples));
    const int64_t n = keys_t.NumElements();
    const int64_t* keys = keys_t.flat<int64_t>().data();
    Tensor *ids_t, *splits_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys_t.shape(), &ids_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_samples + 1}), &splits_t));
    int64_t* ids = ids_t->flat<int64_t>().data();
    int64_t* splits = splits_t->flat<int64_t>().data();
    const int64_t mask = (int64_t{1} << bits_) - 1;
    // One pass: each sample's split is the position of its first key, and
    // a sample without keys takes the next one's.
    int64_t next = 0;  // the first sample whose split is not yet written
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = keys[i];
      OP_REQUIRES(ctx, key >= 0, InvalidArgument("keys[", i, "] = ", key, " is negative"));
      const int64_t sample = key >> bits_;
      OP_REQUIRES(ctx, sample < num_samples,
                  InvalidArgument("keys[", i, "] = ", key, " is of sample ", sample,
                                  ", not below num_samples = ", num_samples));
      OP_REQUIRES(ctx, sample + 1 >= next,
                  InvalidArgument("keys[", i, "] = ", key, " is of sample ", sample,
                                  ", below the sample of the key before it: keys must be in "
                                  "increasing sample"));
      for (; next <= sample; ++next) splits[next] = i;
      ids[i] = key & mask;
    }
    for (; next <= num_samples; ++next) splits[next] = n;
  }

 private:
  int bits_;
};

// Scalars are read on the host; the kernels are the CPU's (the twins run
// elsewhere).
REGISTER_KERNEL_BUILDER(Name("TfdeSampleKeys").Device(DEVICE_CPU), SampleKeysOp);
REGISTER_KERNEL_BUILDER(Name("TfdeSplitSampleKeys").Device(DEVICE_CPU), SplitSampleKeysOp);

}  // namespace tfde
