// TfdeEmbeddingCombine and TfdeEmbeddingCombineGrad: the fused
// "gather by inverse index, weight, reduce per sample" step of a lookup,
// and its gradient with respect to the unique rows.
//
// Semantics follow tf.nn.embedding_lookup_sparse and keras-rs: a sample's
// output is sum_i w_i * row_i, divided by sum_i w_i ("mean") or by
// sqrt(sum_i w_i^2) ("sqrtn"), and a zero divisor gives zeros (div_no_nan),
// as does a sample with no ids.

#include <cmath>
#include <string>
#include <vector>

#include "common.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfde {

REGISTER_OP("TfdeEmbeddingCombine")
    .Input("rows: T")
    .Input("inverse: int32")
    .Input("row_splits: Tsplits")
    .Input("weights: float")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tsplits: {int32, int64}")
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
    .Input("inverse: int32")
    .Input("row_splits: Tsplits")
    .Input("weights: float")
    .Input("num_unique: int32")
    .Output("unique_grad: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tsplits: {int32, int64}")
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

// Validates the ragged structure shared by both ops and computes, per id,
// its sample (bag) and its coefficient w_i / divisor(bag).
template <typename Split>
Status ComputeCoefficients(const Tensor& inverse_t, const Tensor& splits_t,
                           const Tensor& weights_t, int64_t num_rows,
                           Combiner combiner, std::vector<int32_t>* bag_of,
                           std::vector<float>* coefficient) {
  // Shapes are checked (CheckCombineInputs); here the values.
  const int64_t n = inverse_t.NumElements();
  const int64_t batch = splits_t.NumElements() - 1;
  const Split* splits = splits_t.flat<Split>().data();
  if (splits[0] != 0) {
    return InvalidArgument("row_splits[0] must be 0, got ", splits[0]);
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (splits[b + 1] < splits[b]) {
      return InvalidArgument("row_splits must be non-decreasing: row_splits[",
                             b + 1, "] = ", splits[b + 1], " < row_splits[", b,
                             "] = ", splits[b]);
    }
  }
  if (splits[batch] != n) {
    return InvalidArgument("row_splits[-1] = ", splits[batch],
                           " must equal the number of ids, ", n);
  }
  const int64_t num_weights = weights_t.NumElements();
  const int32_t* inverse = inverse_t.flat<int32_t>().data();
  for (int64_t i = 0; i < n; ++i) {
    if (inverse[i] < 0 || inverse[i] >= num_rows) {
      return InvalidArgument("inverse[", i, "] = ", inverse[i],
                             " is out of range [0, ", num_rows, ")");
    }
  }
  const float* weights = num_weights ? weights_t.flat<float>().data() : nullptr;
  bag_of->resize(n);
  coefficient->resize(n);
  for (int64_t b = 0; b < batch; ++b) {
    double divisor_sq = 0.0, divisor = 0.0;
    for (Split i = splits[b]; i < splits[b + 1]; ++i) {
      const double w = weights ? weights[i] : 1.0;
      divisor += w;
      divisor_sq += w * w;
      (*bag_of)[i] = static_cast<int32_t>(b);
    }
    double scale = 1.0;
    if (combiner == Combiner::kMean) {
      scale = divisor == 0.0 ? 0.0 : 1.0 / divisor;
    } else if (combiner == Combiner::kSqrtn) {
      scale = divisor_sq == 0.0 ? 0.0 : 1.0 / std::sqrt(divisor_sq);
    }
    for (Split i = splits[b]; i < splits[b + 1]; ++i) {
      (*coefficient)[i] =
          static_cast<float>((weights ? weights[i] : 1.0) * scale);
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Split>
class EmbeddingCombineOp : public OpKernel {
 public:
  explicit EmbeddingCombineOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &name));
    OP_REQUIRES_OK(ctx, ParseCombiner(name, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(0);
    const Tensor& inverse_t = ctx->input(1);
    const Tensor& splits_t = ctx->input(2);
    const Tensor& weights_t = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckCombineInputs(rows_t, "rows", inverse_t, splits_t, weights_t));
    std::vector<int32_t> bag_of;
    std::vector<float> coefficient;
    OP_REQUIRES_OK(ctx, ComputeCoefficients<Split>(
                            inverse_t, splits_t, weights_t, rows_t.dim_size(0),
                            combiner_, &bag_of, &coefficient));
    const int64_t batch = splits_t.NumElements() - 1;
    const int64_t dim = rows_t.dim_size(1);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, dim}), &out_t));
    const T* rows = rows_t.flat<T>().data();
    const int32_t* inverse = inverse_t.flat<int32_t>().data();
    const Split* splits = splits_t.flat<Split>().data();
    T* out = out_t->flat<T>().data();
    const int64_t n = inverse_t.NumElements();
    const int64_t cost = (batch ? n / batch + 1 : 1) * dim * 2;
    ParallelFor(ctx, batch, cost, [&](int64_t b0, int64_t b1) {
      std::vector<float> acc(dim);
      const int64_t last = splits[b1];
      for (int64_t b = b0; b < b1; ++b) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (Split i = splits[b]; i < splits[b + 1]; ++i) {
          if (i + kPrefetchDistance < last) {
            PrefetchRow(rows + static_cast<int64_t>(inverse[i + kPrefetchDistance]) * dim,
                        dim * sizeof(T), false);
          }
          const float c = coefficient[i];
          const T* row = rows + static_cast<int64_t>(inverse[i]) * dim;
          for (int64_t d = 0; d < dim; ++d) acc[d] += c * static_cast<float>(row[d]);
        }
        T* o = out + b * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(acc[d]);
      }
    });
  }

 private:
  Combiner combiner_;
};

template <typename T, typename Split>
class EmbeddingCombineGradOp : public OpKernel {
 public:
  explicit EmbeddingCombineGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &name));
    OP_REQUIRES_OK(ctx, ParseCombiner(name, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad_t = ctx->input(0);
    const Tensor& inverse_t = ctx->input(1);
    const Tensor& splits_t = ctx->input(2);
    const Tensor& weights_t = ctx->input(3);
    const Tensor& num_unique_t = ctx->input(4);
    int64_t num_unique;
    OP_REQUIRES_OK(ctx, CheckCombineGradInputs(grad_t, inverse_t, splits_t, weights_t,
                                               num_unique_t, &num_unique));
    std::vector<int32_t> bag_of;
    std::vector<float> coefficient;
    OP_REQUIRES_OK(ctx, ComputeCoefficients<Split>(inverse_t, splits_t,
                                                   weights_t, num_unique,
                                                   combiner_, &bag_of,
                                                   &coefficient));
    const int64_t n = inverse_t.NumElements();
    const int64_t dim = grad_t.dim_size(1);
    const int32_t* inverse = inverse_t.flat<int32_t>().data();

    // CSR of ids by unique row, so each output row is owned by one thread
    // and summed without atomics, in id order (deterministic).
    std::vector<int64_t> row_begin(num_unique + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++row_begin[inverse[i] + 1];
    for (int64_t k = 0; k < num_unique; ++k) row_begin[k + 1] += row_begin[k];
    std::vector<int32_t> ids_of_row(n);
    {
      std::vector<int64_t> cursor(row_begin.begin(), row_begin.end() - 1);
      for (int64_t i = 0; i < n; ++i) ids_of_row[cursor[inverse[i]]++] = i;
    }

    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique, dim}),
                                             &out_t));
    const T* grad = grad_t.flat<T>().data();
    T* out = out_t->flat<T>().data();
    const int64_t cost = (num_unique ? n / num_unique + 1 : 1) * dim * 2;
    ParallelFor(ctx, num_unique, cost, [&](int64_t k0, int64_t k1) {
      std::vector<float> acc(dim);
      for (int64_t k = k0; k < k1; ++k) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = row_begin[k]; j < row_begin[k + 1]; ++j) {
          const int32_t i = ids_of_row[j];
          const float c = coefficient[i];
          const T* g = grad + static_cast<int64_t>(bag_of[i]) * dim;
          for (int64_t d = 0; d < dim; ++d) acc[d] += c * static_cast<float>(g[d]);
        }
        T* o = out + k * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(acc[d]);
      }
    });
  }

 private:
  Combiner combiner_;
};

#define REGISTER_COMBINE(T, Split)                                          \
  REGISTER_KERNEL_BUILDER(Name("TfdeEmbeddingCombine")                      \
                              .Device(DEVICE_CPU)                           \
                              .TypeConstraint<T>("T")                       \
                              .TypeConstraint<Split>("Tsplits"),            \
                          EmbeddingCombineOp<T, Split>);                    \
  REGISTER_KERNEL_BUILDER(Name("TfdeEmbeddingCombineGrad")                  \
                              .Device(DEVICE_CPU)                           \
                              .HostMemory("num_unique")                     \
                              .TypeConstraint<T>("T")                       \
                              .TypeConstraint<Split>("Tsplits"),            \
                          EmbeddingCombineGradOp<T, Split>);
#define REGISTER_COMBINE_ALL_SPLITS(T) \
  REGISTER_COMBINE(T, int32_t)         \
  REGISTER_COMBINE(T, int64_t)
REGISTER_COMBINE_ALL_SPLITS(float);
REGISTER_COMBINE_ALL_SPLITS(Eigen::half);
REGISTER_COMBINE_ALL_SPLITS(Eigen::bfloat16);
#undef REGISTER_COMBINE_ALL_SPLITS
#undef REGISTER_COMBINE

}  // namespace tfde
