// TfdeEmbeddingCombine and TfdeEmbeddingCombineGrad: the fused
// "gather by inverse index, weight, reduce per sample" step of a lookup,
// and its gradient with respect to the unique rows.
//
// Semantics follow tf.nn.embedding_lookup_sparse and keras-rs: a sample's
// output is sum_i w_i * row_i, divided by sum_i w_i ("mean") or by
// sqrt(sum_i w_i^2) ("sqrtn"), and a zero divisor gives zeros (div_no_nan),
// as does a sample with no ids.

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "bag_gradients.h"
#include "common.h"
#include "fused_tables.h"
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

REGISTER_OP("TfdeCombineFromTables")
    .Input("tables: num_tables * resource")
    .Input("rows: Tindices")
    .Input("inverse: Tinverse")
    .Input("row_splits: Tsplits")
    .Input("weights: float")
    .Output("output: float")
    .Attr("num_tables: int >= 1")
    .Attr("bases: list(int)")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tsplits: {int32, int64}")
    .Attr("Tinverse: {int32, int64} = DT_INT32")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int num_tables;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &num_tables));
      shape_inference::ShapeHandle splits, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables + 1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables + 2), 1, &splits));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables + 3), 1, &unused));
      shape_inference::DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &batch));
      c->set_output(0, c->Matrix(batch, c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
TfdeEmbeddingCombine reading its rows straight from a group's tables:
rows[k] is a fused row (TfdeGatherFromTables's row space), and output[b]
combines the rows rows[inverse[i]] of sample b's ids. Equal to combining
TfdeGatherFromTables(tables, rows), without writing the gathered rows.
)doc");

// Each id's sample (bag) and coefficient w_i / divisor(bag), in scratch
// memory from the context.
struct Coefficients {
  Int32Indices inverse;  // checked, as int32; inverse.end: the rows the ids read
  Tensor bag_of_t, coefficient_t;
  int32_t* bag_of = nullptr;
  float* coefficient = nullptr;
};

// Validates the ragged structure shared by the combine ops and computes,
// per id, its sample (bag) and its coefficient w_i / divisor(bag).
template <typename Split>
Status ComputeCoefficients(OpKernelContext* ctx, const Tensor& inverse_t,
                           const Tensor& splits_t, const Tensor& weights_t,
                           int64_t num_rows, Combiner combiner, Coefficients* out) {
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
  TF_RETURN_IF_ERROR(ReadIndices(ctx, inverse_t, "inverse", num_rows, &out->inverse));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &out->bag_of_t, &out->bag_of));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &out->coefficient_t, &out->coefficient));
  const float* weights = num_weights ? weights_t.flat<float>().data() : nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    double divisor_sq = 0.0, divisor = 0.0;
    for (Split i = splits[b]; i < splits[b + 1]; ++i) {
      const double w = weights ? weights[i] : 1.0;
      divisor += w;
      divisor_sq += w * w;
      out->bag_of[i] = static_cast<int32_t>(b);
    }
    double scale = 1.0;
    if (combiner == Combiner::kMean) {
      scale = divisor == 0.0 ? 0.0 : 1.0 / divisor;
    } else if (combiner == Combiner::kSqrtn) {
      scale = divisor_sq == 0.0 ? 0.0 : 1.0 / std::sqrt(divisor_sq);
    }
    for (Split i = splits[b]; i < splits[b + 1]; ++i) {
      out->coefficient[i] = static_cast<float>((weights ? weights[i] : 1.0) * scale);
    }
  }
  return absl::OkStatus();
}

// The bag-gradient view of the n ids (bag_gradients.h): ids grouped by
// unique row (of num_rows), with their bag and coefficient.
inline void BuildBagGradientIndex(const Coefficients& c, int64_t n, int64_t num_rows,
                                  int64_t* segments, int32_t* bags, float* bag_weights) {
  GroupByRow(c.inverse.data, n, num_rows, segments, [&](int64_t i, int64_t j) {
    bags[j] = c.bag_of[i];
    bag_weights[j] = c.coefficient[i];
  });
}

template <typename Split>
class BagGradientIndexOp : public OpKernel {
 public:
  explicit BagGradientIndexOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &name));
    OP_REQUIRES_OK(ctx, ParseCombiner(name, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& inverse_t = ctx->input(0);
    const Tensor& splits_t = ctx->input(1);
    const Tensor& weights_t = ctx->input(2);
    const Tensor& num_unique_t = ctx->input(3);
    int64_t num_unique;
    OP_REQUIRES_OK(ctx, CheckRaggedInputs(inverse_t, splits_t, weights_t));
    OP_REQUIRES_OK(ctx, ReadNumUnique(num_unique_t, &num_unique));
    Coefficients coefficients;
    OP_REQUIRES_OK(ctx, ComputeCoefficients<Split>(ctx, inverse_t, splits_t, weights_t,
                                                   num_unique, combiner_, &coefficients));
    const int64_t n = inverse_t.NumElements();
    Tensor *segments_t, *bags_t, *weights_out_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique + 1}), &segments_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &bags_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &weights_out_t));
    BuildBagGradientIndex(coefficients, n, num_unique, segments_t->flat<int64_t>().data(),
                          bags_t->flat<int32_t>().data(),
                          weights_out_t->flat<float>().data());
  }

 private:
  Combiner combiner_;
};

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
    Coefficients coefficients;
    OP_REQUIRES_OK(ctx, ComputeCoefficients<Split>(ctx, inverse_t, splits_t, weights_t,
                                                   rows_t.dim_size(0), combiner_,
                                                   &coefficients));
    const float* coefficient = coefficients.coefficient;
    const int64_t batch = splits_t.NumElements() - 1;
    const int64_t dim = rows_t.dim_size(1);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, dim}), &out_t));
    const T* rows = rows_t.flat<T>().data();
    const int32_t* inverse = coefficients.inverse.data;
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

template <typename Index, typename Split>
class CombineFromTablesOp : public OpKernel {
 public:
  explicit CombineFromTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadFusedTablesAttrs(ctx, &num_tables_, &bases_));
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &name));
    OP_REQUIRES_OK(ctx, ParseCombiner(name, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(num_tables_);
    const Tensor& inverse_t = ctx->input(num_tables_ + 1);
    const Tensor& splits_t = ctx->input(num_tables_ + 2);
    const Tensor& weights_t = ctx->input(num_tables_ + 3);
    OP_REQUIRES(ctx, rows_t.dims() == 1,
                InvalidArgument("rows must be a vector, got shape ",
                                rows_t.shape().DebugString()));
    // Shared locks: concurrent lookups proceed, updates wait.
    FusedTables tables;
    OP_REQUIRES_OK(ctx, tables.Acquire(ctx, bases_));
    const int64_t dim = tables.dim();
    OP_REQUIRES_OK(ctx, CheckRaggedInputs(inverse_t, splits_t, weights_t));
    const Index* rows = rows_t.flat<Index>().data();
    const int64_t m = rows_t.NumElements();
    // Every row resolved to its table's memory first, in parallel: all of
    // `rows` must lie in the group's tables, as for TfdeGatherFromTables,
    // and the first that does not is an error before any output exists.
    Tensor row_data_t;
    uint64_t* row_addresses;
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, m, &row_data_t, &row_addresses));
    const float** row_data = reinterpret_cast<const float**>(row_addresses);
    std::atomic<int64_t> first_bad{m};
    ParallelFor(ctx, m, 8, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const int t = tables.TableOf(rows[k]);
        if (t >= 0) {
          row_data[k] = tables.Row(t, rows[k]);
          continue;
        }
        int64_t seen = first_bad.load();
        while (k < seen && !first_bad.compare_exchange_weak(seen, k)) {
        }
        return;
      }
    });
    const int64_t bad = first_bad.load();
    OP_REQUIRES(ctx, bad == m,
                InvalidArgument("rows[", bad, "] = ",
                                bad < m ? static_cast<int64_t>(rows[bad]) : 0,
                                " is outside every table of the group"));
    Coefficients coefficients;
    OP_REQUIRES_OK(ctx, ComputeCoefficients<Split>(ctx, inverse_t, splits_t, weights_t,
                                                   rows_t.NumElements(), combiner_,
                                                   &coefficients));
    const float* coefficient = coefficients.coefficient;
    const int32_t* inverse = coefficients.inverse.data;
    const int64_t n = inverse_t.NumElements();
    const Split* splits = splits_t.flat<Split>().data();
    const int64_t batch = splits_t.NumElements() - 1;
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, dim}), &out_t));
    float* out = out_t->flat<float>().data();
    const int64_t cost = (batch ? n / batch + 1 : 1) * dim * 2;
    ParallelFor(ctx, batch, cost, [&](int64_t b0, int64_t b1) {
      std::vector<float> acc(dim);
      const int64_t last = splits[b1];
      for (int64_t b = b0; b < b1; ++b) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (Split i = splits[b]; i < splits[b + 1]; ++i) {
          if (i + kPrefetchDistance < last) {
            PrefetchRow(row_data[inverse[i + kPrefetchDistance]], dim * sizeof(float), false);
          }
          const float* row = row_data[inverse[i]];
          const float c = coefficient[i];
          for (int64_t d = 0; d < dim; ++d) acc[d] += c * row[d];
        }
        std::copy(acc.begin(), acc.end(), out + b * dim);
      }
    });
  }

 private:
  int num_tables_;
  std::vector<int64_t> bases_;
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
    const int64_t n = inverse_t.NumElements();
    const int64_t dim = grad_t.dim_size(1);
    Coefficients coefficients;
    OP_REQUIRES_OK(ctx, ComputeCoefficients<Split>(ctx, inverse_t, splits_t, weights_t,
                                                   num_unique, combiner_, &coefficients));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique, dim}),
                                             &out_t));
    if (out_t->NumElements() == 0) return;
    // Rows past the last one an id reads get zeros: only rows_read rows
    // need a segment, so the scratch is no larger than the inputs however
    // large num_unique is.
    const int64_t rows_read = coefficients.inverse.end;
    Tensor segments_t, bags_t, bag_weights_t;
    int64_t* segments;
    int32_t* bags;
    float* bag_weights;
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, rows_read + 1, &segments_t, &segments));
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, n, &bags_t, &bags));
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, n, &bag_weights_t, &bag_weights));
    BuildBagGradientIndex(coefficients, n, rows_read, segments, bags, bag_weights);
    BagGradients<T> bag_grads;
    bag_grads.output_grad = grad_t.flat<T>().data();
    bag_grads.num_bags = grad_t.dim_size(0);
    bag_grads.dim = dim;
    bag_grads.segments = segments;
    bag_grads.num_rows = rows_read;
    bag_grads.bags = bags;
    bag_grads.weights = bag_weights;

    T* out = out_t->flat<T>().data();
    // Each output row is owned by one thread and summed without atomics,
    // in id order (deterministic).
    const int64_t cost = (num_unique ? n / num_unique + 1 : 1) * dim * 2;
    ParallelFor(ctx, num_unique, cost, [&](int64_t k0, int64_t k1) {
      std::vector<float> acc(dim);
      for (int64_t k = k0; k < k1; ++k) {
        T* o = out + k * dim;
        if (k >= rows_read) {
          std::fill_n(o, dim, static_cast<T>(0.0f));
          continue;
        }
        bag_grads.Row(k, acc.data());
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
#define REGISTER_COMBINE_FROM_TABLES(Index, Split)                      \
  REGISTER_KERNEL_BUILDER(Name("TfdeCombineFromTables")                 \
                              .Device(DEVICE_CPU)                       \
                              .TypeConstraint<Index>("Tindices")        \
                              .TypeConstraint<Split>("Tsplits"),        \
                          CombineFromTablesOp<Index, Split>);
REGISTER_COMBINE_FROM_TABLES(int32_t, int32_t);
REGISTER_COMBINE_FROM_TABLES(int32_t, int64_t);
REGISTER_COMBINE_FROM_TABLES(int64_t, int32_t);
REGISTER_COMBINE_FROM_TABLES(int64_t, int64_t);
#undef REGISTER_COMBINE_FROM_TABLES
#define REGISTER_BAG_GRADIENT_INDEX(Split)                              \
  REGISTER_KERNEL_BUILDER(Name("TfdeBagGradientIndex")                  \
                              .Device(DEVICE_CPU)                       \
                              .HostMemory("num_unique")                 \
                              .TypeConstraint<Split>("Tsplits"),        \
                          BagGradientIndexOp<Split>);
REGISTER_BAG_GRADIENT_INDEX(int32_t);
REGISTER_BAG_GRADIENT_INDEX(int64_t);
#undef REGISTER_BAG_GRADIENT_INDEX
#define REGISTER_COMBINE_ALL_SPLITS(T) \
  REGISTER_COMBINE(T, int32_t)         \
  REGISTER_COMBINE(T, int64_t)
REGISTER_COMBINE_ALL_SPLITS(float);
REGISTER_COMBINE_ALL_SPLITS(Eigen::half);
REGISTER_COMBINE_ALL_SPLITS(Eigen::bfloat16);
#undef REGISTER_COMBINE_ALL_SPLITS
#undef REGISTER_COMBINE

}  // namespace tfde
