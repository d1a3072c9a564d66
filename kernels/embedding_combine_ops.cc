// TfdeEmbeddingCombine and TfdeEmbeddingCombineGrad: the fused
// "gather by inverse index, weight, reduce per sample" step of a lookup,
// and its gradient with respect to the unique rows; TfdeBagGradientIndex,
// that gradient left as the ids of each row (bag_gradients.h).
//
// Semantics follow tf.nn.embedding_lookup_sparse and keras-rs: a sample's
// output is sum_i w_i * row_i, divided by sum_i w_i ("mean") or by
// sqrt(sum_i w_i^2) ("sqrtn"), and a zero divisor gives zeros (div_no_nan),
// as does a sample with no ids.
//
// One op class per op, templated on the device; the CPU functors are below,
// the GPU ones in cuda/gpu_functors.cc (combine_functor.h declares both).
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bag_gradients.h"
#include "combine_functor.h"
#include "common.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfde {

REGISTER_OP("TfdeEmbeddingCombine")
    .Input("rows: T")
    .Input("inverse: Tinverse")
    .Input("row_splits: Tsplits")
    .Input("weights: float")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tsplits: {int32, int64}")
    .Attr("Tinverse: {int32, int64} = DT_INT32")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle rows, inverse, splits, weights;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &inverse));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &splits));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &weights));
      shape_inference::DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &batch));
      c->set_output(0, c->Matrix(batch, c->Dim(rows, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
output[b] = combine(weights[i] * rows[inverse[i]] for i in
row_splits[b]..row_splits[b+1]). An empty `weights` means every weight is 1.
)doc");

REGISTER_OP("TfdeEmbeddingCombineGrad")
    .Input("grad: T")
    .Input("inverse: Tinverse")
    .Input("row_splits: Tsplits")
    .Input("weights: float")
    .Input("num_unique: Tnum_unique")
    .Output("unique_grad: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tsplits: {int32, int64}")
    .Attr("Tinverse: {int32, int64} = DT_INT32")
    .Attr("Tnum_unique: {int32, int64} = DT_INT32")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle grad, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &unused));
      shape_inference::DimensionHandle num_unique;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &num_unique));
      c->set_output(0, c->Matrix(num_unique, c->Dim(grad, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of TfdeEmbeddingCombine with respect to `rows`: one summed
gradient row per unique id (a segment sum over the ids that share it).
)doc");

REGISTER_OP("TfdeBagGradientIndex")
    .Input("inverse: Tinverse")
    .Input("row_splits: Tsplits")
    .Input("weights: float")
    .Input("num_unique: Tnum_unique")
    .Output("segments: int64")
    .Output("bags: int32")
    .Output("bag_weights: float")
    .Attr("Tsplits: {int32, int64}")
    .Attr("Tinverse: {int32, int64} = DT_INT32")
    .Attr("Tnum_unique: {int32, int64} = DT_INT32")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle inverse, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &inverse));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &unused));
      shape_inference::DimensionHandle num_unique, segments;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3, &num_unique));
      TF_RETURN_IF_ERROR(c->Add(num_unique, 1, &segments));
      c->set_output(0, c->Vector(segments));
      c->set_output(1, c->Vector(c->Dim(inverse, 0)));
      c->set_output(2, c->Vector(c->Dim(inverse, 0)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
TfdeEmbeddingCombineGrad's result left unsummed (see kernels/bag_gradients.h):
unique row k's gradient is sum_j bag_weights[j] * grad[bags[j]] over j in
[segments[k], segments[k+1]), entries in id order. The sparse optimizers'
FromBags variants take it instead of a gradient matrix.
)doc");

template <typename Device, typename T, typename Split>
class EmbeddingCombineOp : public OpKernel {
 public:
  explicit EmbeddingCombineOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiner(ctx, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    const Tensor& inverse = ctx->input(1);
    const Tensor& splits = ctx->input(2);
    const Tensor& weights = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckCombineInputs(rows, "rows", inverse, splits, weights));
    Coefficients coefficients;
    coefficients.combine_only = true;
    OP_REQUIRES_OK(ctx, PrepareCoefficients<Device, Split>(
                            ctx, inverse, splits, weights, rows.dim_size(0), combiner_,
                            &coefficients));
    const int64_t batch = splits.NumElements() - 1;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, rows.dim_size(1)}), &out));
    OP_REQUIRES_OK(ctx, functor::EmbeddingCombine<Device, T, Split>()(ctx, rows, splits,
                                                                       coefficients, out));
  }

 private:
  Combiner combiner_;
};

template <typename Device, typename T, typename Split>
class EmbeddingCombineGradOp : public OpKernel {
 public:
  explicit EmbeddingCombineGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiner(ctx, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& inverse = ctx->input(1);
    const Tensor& splits = ctx->input(2);
    const Tensor& weights = ctx->input(3);
    int64_t num_unique;
    OP_REQUIRES_OK(ctx, CheckCombineGradInputs(grad, inverse, splits, weights, ctx->input(4),
                                               &num_unique));
    Coefficients coefficients;
    OP_REQUIRES_OK(ctx, PrepareCoefficients<Device, Split>(ctx, inverse, splits, weights,
                                                           num_unique, combiner_,
                                                           &coefficients));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique, grad.dim_size(1)}),
                                             &out));
    if (out->NumElements() == 0) return;
    OP_REQUIRES_OK(ctx, functor::EmbeddingCombineGrad<Device, T>()(ctx, grad, coefficients,
                                                                    out));
  }

 private:
  Combiner combiner_;
};

template <typename Device, typename Split>
class BagGradientIndexOp : public OpKernel {
 public:
  explicit BagGradientIndexOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiner(ctx, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& inverse = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    const Tensor& weights = ctx->input(2);
    int64_t num_unique;
    OP_REQUIRES_OK(ctx, CheckRaggedInputs(inverse, splits, weights));
    OP_REQUIRES_OK(ctx, ReadNumUnique(ctx->input(3), &num_unique));
    Coefficients coefficients;
    OP_REQUIRES_OK(ctx, PrepareCoefficients<Device, Split>(ctx, inverse, splits, weights,
                                                           num_unique, combiner_,
                                                           &coefficients));
    const int64_t n = inverse.NumElements();
    Tensor *segments, *bags, *bag_weights;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique + 1}), &segments));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &bags));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &bag_weights));
    OP_REQUIRES_OK(ctx, functor::BagGradientIndex<Device>()(ctx, coefficients, num_unique,
                                                            segments, bags, bag_weights));
  }

 private:
  Combiner combiner_;
};

// ---- CPU functors

namespace {

// The values' checks of a ragged batch (shapes were checked): the lowest
// offending split and id, as RaggedBatchErrors describes them.
template <typename Split, typename Index>
void FindRaggedBatchErrors(OpKernelContext* ctx, const Split* splits, int64_t batch,
                           const Index* inverse, int64_t n, int64_t num_rows,
                           RaggedBatchErrors* bad, int64_t* rows_read) {
  if (splits[0] != 0) {
    bad->split = 0;
    return;
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (splits[b + 1] < splits[b]) {
      bad->split = b + 1;
      return;
    }
  }
  if (splits[batch] != n) {
    bad->split = batch;
    return;
  }
  num_rows = IndexBound(num_rows);
  // The bounds first, in parallel loops the compiler vectorizes; the first
  // offender is searched for only when there is one.
  auto [smallest, largest] = ParallelMinMax(ctx, inverse, n);
  if (n == 0) largest = -1;
  if (n > 0 && (smallest < 0 || largest >= num_rows)) {
    for (int64_t i = 0; i < n; ++i) {
      if (inverse[i] < 0 || inverse[i] >= num_rows) {
        bad->inverse = i;
        return;
      }
    }
  }
  *rows_read = static_cast<int64_t>(largest) + 1;
}

}  // namespace

template <typename Split>
Status functor::CombineCoefficients<CPUDevice, Split>::operator()(
    OpKernelContext* ctx, const Tensor& inverse_t, const Tensor& splits_t,
    const Tensor& weights_t, int64_t num_rows, Combiner combiner, Coefficients* out,
    RaggedBatchErrors* errors) const {
  const int64_t n = inverse_t.NumElements();
  const int64_t batch = splits_t.NumElements() - 1;
  const Split* splits = splits_t.flat<Split>().data();
  if (inverse_t.dtype() == tensorflow::DT_INT64) {
    FindRaggedBatchErrors(ctx, splits, batch, inverse_t.flat<int64_t>().data(), n, num_rows,
                          errors, &out->rows_read);
  } else {
    FindRaggedBatchErrors(ctx, splits, batch, inverse_t.flat<int32_t>().data(), n, num_rows,
                          errors, &out->rows_read);
  }
  if (errors->split >= 0 || errors->inverse >= 0) return absl::OkStatus();
  TF_RETURN_IF_ERROR(Int32View(ctx, inverse_t, &out->narrowed_inverse, &out->inverse));
  const float* weights = weights_t.NumElements() ? weights_t.flat<float>().data() : nullptr;
  out->weights = weights;
  out->combiner = combiner;
  // A combine alone computes each sample's coefficients as it reads them
  // (CombineSamples), in parallel, and never reads an id's sample.
  if (out->combine_only) return absl::OkStatus();
  int32_t* bag_of;
  float* coefficient;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &out->bag_of, &bag_of));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &out->coefficient, &coefficient));
  for (int64_t b = 0; b < batch; ++b) {
    const double scale = SampleScale(weights, splits[b], splits[b + 1], combiner);
    for (Split i = splits[b]; i < splits[b + 1]; ++i) {
      bag_of[i] = static_cast<int32_t>(b);
      coefficient[i] = static_cast<float>((weights ? weights[i] : 1.0) * scale);
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Split>
Status functor::EmbeddingCombine<CPUDevice, T, Split>::operator()(
    OpKernelContext* ctx, const Tensor& rows_t, const Tensor& splits_t, const Coefficients& c,
    Tensor* out_t) const {
  const T* rows = rows_t.flat<T>().data();
  const int64_t dim = rows_t.dim_size(1);
  CombineRows<T, Split>(ctx, splits_t, c, dim, [rows, dim](int32_t k) { return rows + k * dim; },
                        out_t->flat<T>().data());
  return absl::OkStatus();
}

namespace {

// The bag-gradient view of the ids (bag_gradients.h): ids grouped by row
// (of num_rows), with their bag and coefficient.
Status BuildBagGradientIndex(OpKernelContext* ctx, const Coefficients& c, int64_t num_rows,
                             int64_t* segments, int32_t* bags, float* bag_weights) {
  const int32_t* bag_of = c.bag_of.flat<int32_t>().data();
  const float* coefficient = c.coefficient.flat<float>().data();
  return GroupByRowInParallel(ctx, c.inverse, c.bag_of.NumElements(), num_rows, segments,
                              [&](int64_t i, int64_t j) {
                                bags[j] = bag_of[i];
                                bag_weights[j] = coefficient[i];
                              });
}

// Rows [k0, k1) of a bag gradient written to out (k1 <= rows read), at a
// width known when compiled (kDim > 0, WithCompiledWidth) and for AVX2 and
// FMA as well as baseline x86-64, compiled as the optimizers' update loops
// compile theirs: on one machine a row's gradient has the same bits by
// either path.
template <int kDim, typename T>
TFDE_VECTOR_CLONES TFDE_NO_UNROLL_AND_JAM void SumBagRows(const BagGradients<T>& bags, int64_t k0,
                                                          int64_t k1, T* out) {
  const int64_t dim = kDim > 0 ? kDim : bags.dim;
  RowScratch<kDim> scratch(dim);
  float* acc = scratch.data();
  for (int64_t k = k0; k < k1; ++k) {
    bags.template Row<kDim>(k, acc);
    T* o = out + k * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(acc[d]);
  }
}

}  // namespace

Status functor::BagGradientIndex<CPUDevice>::operator()(OpKernelContext* ctx,
                                                        const Coefficients& c,
                                                        int64_t num_unique, Tensor* segments,
                                                        Tensor* bags,
                                                        Tensor* bag_weights) const {
  return BuildBagGradientIndex(ctx, c, num_unique, segments->flat<int64_t>().data(),
                               bags->flat<int32_t>().data(), bag_weights->flat<float>().data());
}

template <typename T>
Status functor::EmbeddingCombineGrad<CPUDevice, T>::operator()(OpKernelContext* ctx,
                                                               const Tensor& grad_t,
                                                               const Coefficients& c,
                                                               Tensor* out_t) const {
  const int64_t n = c.bag_of.NumElements();
  const int64_t num_unique = out_t->dim_size(0);
  const int64_t dim = grad_t.dim_size(1);
  // Rows past the last one an id reads get zeros: only rows_read rows need
  // a segment, so the scratch is no larger than the inputs however large
  // num_unique is.
  const int64_t rows_read = c.rows_read;
  Tensor segments_t, bags_t, bag_weights_t;
  int64_t* segments;
  int32_t* bags;
  float* bag_weights;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, rows_read + 1, &segments_t, &segments));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &bags_t, &bags));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &bag_weights_t, &bag_weights));
  TF_RETURN_IF_ERROR(BuildBagGradientIndex(ctx, c, rows_read, segments, bags, bag_weights));
  BagGradients<T> bag_grads;
  bag_grads.output_grad = grad_t.flat<T>().data();
  bag_grads.num_bags = grad_t.dim_size(0);
  bag_grads.dim = dim;
  bag_grads.segments = segments;
  bag_grads.num_rows = rows_read;
  bag_grads.bags = bags;
  bag_grads.weights = bag_weights;
  T* out = out_t->flat<T>().data();
  // Each output row is owned by one thread and summed without atomics, in
  // id order (deterministic).
  const int64_t cost = (num_unique ? n / num_unique + 1 : 1) * dim * 2;
  WithCompiledWidth(dim, [&](auto width) {
    ParallelFor(ctx, num_unique, cost, [&](int64_t k0, int64_t k1) {
      SumBagRows<decltype(width)::value>(bag_grads, k0, std::min(k1, rows_read), out);
      if (k1 > rows_read) {
        const int64_t first = std::max(k0, rows_read);
        std::fill_n(out + first * dim, (k1 - first) * dim, static_cast<T>(0.0f));
      }
    });
  });
  return absl::OkStatus();
}

// ---- registration: the GPU launchers read an int32 inverse, so an int64
// one runs on the CPU kernels; num_unique is read on the host.

#define REGISTER_COMBINE(DEV, T, Split, ...)                                    \
  REGISTER_KERNEL_BUILDER(Name("TfdeEmbeddingCombine")                          \
                              .Device(DEVICE_##DEV)                             \
                              .TypeConstraint<T>("T")                           \
                              .TypeConstraint<Split>("Tsplits") __VA_ARGS__,    \
                          EmbeddingCombineOp<DEV##Device, T, Split>);           \
  REGISTER_KERNEL_BUILDER(Name("TfdeEmbeddingCombineGrad")                      \
                              .Device(DEVICE_##DEV)                             \
                              .HostMemory("num_unique")                         \
                              .TypeConstraint<T>("T")                           \
                              .TypeConstraint<Split>("Tsplits") __VA_ARGS__,    \
                          EmbeddingCombineGradOp<DEV##Device, T, Split>);
#define REGISTER_COMBINE_ALL(DEV, T, ...)        \
  REGISTER_COMBINE(DEV, T, int32_t, __VA_ARGS__) \
  REGISTER_COMBINE(DEV, T, int64_t, __VA_ARGS__)
REGISTER_COMBINE_ALL(CPU, float, )
REGISTER_COMBINE_ALL(CPU, Eigen::half, )
REGISTER_COMBINE_ALL(CPU, Eigen::bfloat16, )
#if GOOGLE_CUDA
REGISTER_COMBINE_ALL(GPU, float, .TypeConstraint<int32_t>("Tinverse"))
REGISTER_COMBINE_ALL(GPU, Eigen::half, .TypeConstraint<int32_t>("Tinverse"))
REGISTER_COMBINE_ALL(GPU, Eigen::bfloat16, .TypeConstraint<int32_t>("Tinverse"))
#endif
#undef REGISTER_COMBINE_ALL
#undef REGISTER_COMBINE

#define REGISTER_BAG_GRADIENT_INDEX(Split)                              \
  REGISTER_KERNEL_BUILDER(Name("TfdeBagGradientIndex")                  \
                              .Device(DEVICE_CPU)                       \
                              .HostMemory("num_unique")                 \
                              .TypeConstraint<Split>("Tsplits"),        \
                          BagGradientIndexOp<CPUDevice, Split>);
REGISTER_BAG_GRADIENT_INDEX(int32_t);
REGISTER_BAG_GRADIENT_INDEX(int64_t);
#undef REGISTER_BAG_GRADIENT_INDEX

}  // namespace tfde
