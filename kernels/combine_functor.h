// The per-device parts of the combine ops (embedding_combine_ops.cc) and of
// TfdeCombineFromTables (gather_from_tables_op.cc).
#ifndef TFDE_KERNELS_COMBINE_FUNCTOR_H_
#define TFDE_KERNELS_COMBINE_FUNCTOR_H_

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "device.h"
#include "kernel_params.h"

namespace tfde {

// A checked ragged batch: the inverse index as int32 and, per id, its sample
// (bag) and coefficient w_i / divisor(sample); all on the op's device, in
// scratch from the context.
struct Coefficients {
  const int32_t* inverse = nullptr;
  Tensor narrowed_inverse;  // an int64 inverse, narrowed once checked
  Tensor bag_of;            // [n] int32
  Tensor coefficient;       // [n] float
  int64_t rows_read = 0;    // max(inverse) + 1 (CPU), for scratch sizes
  // Set before CombineCoefficients runs: only a combine reads the result.
  // The CPU then fills neither bag_of nor coefficient: its combine loop
  // computes each sample's coefficients from these two as it goes.
  bool combine_only = false;
  const float* weights = nullptr;  // CPU: the weights, or none (all 1)
  Combiner combiner = Combiner::kSum;
  // CPU: every coefficient is 1 (an unweighted sum).
  bool unit_coefficients() const { return weights == nullptr && combiner == Combiner::kSum; }
};

// The combiner's scale of the sample of ids [begin, end): 1 for a sum,
// 1 / sum(w) for a mean, 1 / sqrt(sum(w^2)) for sqrtn, 0 where that sum
// is 0; summed in float64 in id order (weights null: every w is 1). Id i's
// coefficient is float(w_i * scale). One definition for the CPU's
// coefficients and its combine loop, so both round alike.
template <typename Split>
inline double SampleScale(const float* weights, Split begin, Split end, Combiner combiner) {
  if (combiner == Combiner::kSum) return 1.0;
  double divisor = 0.0, divisor_sq = 0.0;
  for (Split i = begin; i < end; ++i) {
    const double w = weights ? weights[i] : 1.0;
    divisor += w;
    divisor_sq += w * w;
  }
  if (combiner == Combiner::kMean) return divisor == 0.0 ? 0.0 : 1.0 / divisor;
  return divisor_sq == 0.0 ? 0.0 : 1.0 / std::sqrt(divisor_sq);
}

// The lowest offending positions of a ragged batch, -1 where none: the
// split b (0: row_splits[0] != 0; b: row_splits[b] < row_splits[b - 1];
// batch: row_splits[batch] != the number of ids) and the id whose inverse
// is out of range.
struct RaggedBatchErrors {
  int64_t split = -1;
  int64_t inverse = -1;
};

namespace functor {

// Checks row_splits and inverse (each in [0, num_rows)); when both hold,
// fills `out` with the combiner's coefficients (weights empty: all 1).
#define TFDE_COMBINE_COEFFICIENTS_SIGNATURE                                        \
  Status operator()(OpKernelContext* ctx, const Tensor& inverse, const Tensor& splits, \
                    const Tensor& weights, int64_t num_rows, Combiner combiner,    \
                    Coefficients* out, RaggedBatchErrors* errors) const
// out[b] = the sum over ids i of sample b of coefficient[i] * rows[inverse[i]].
#define TFDE_EMBEDDING_COMBINE_SIGNATURE                                             \
  Status operator()(OpKernelContext* ctx, const Tensor& rows, const Tensor& splits, \
                    const Coefficients& c, Tensor* out) const
// out[k] = the sum over ids i with inverse[i] == k of coefficient[i] *
// grad[bag_of[i]], in id order (deterministic); rows no id reads are 0.
#define TFDE_EMBEDDING_COMBINE_GRAD_SIGNATURE \
  Status operator()(OpKernelContext* ctx, const Tensor& grad, const Coefficients& c, \
                    Tensor* out) const

template <typename Device, typename Split>
struct CombineCoefficients;
template <typename Device, typename T, typename Split>
struct EmbeddingCombine;
template <typename Device, typename T>
struct EmbeddingCombineGrad;

// The ids grouped by unique row (kernels/bag_gradients.h): segments
// [num_unique + 1], and each entry's sample and coefficient. CPU only.
template <typename Device>
struct BagGradientIndex;

// Defined in embedding_combine_ops.cc.
template <typename Split>
struct CombineCoefficients<CPUDevice, Split> {
  TFDE_COMBINE_COEFFICIENTS_SIGNATURE;
};
template <typename T, typename Split>
struct EmbeddingCombine<CPUDevice, T, Split> {
  TFDE_EMBEDDING_COMBINE_SIGNATURE;
};
template <typename T>
struct EmbeddingCombineGrad<CPUDevice, T> {
  TFDE_EMBEDDING_COMBINE_GRAD_SIGNATURE;
};
template <>
struct BagGradientIndex<CPUDevice> {
  Status operator()(OpKernelContext* ctx, const Coefficients& c, int64_t num_unique,
                    Tensor* segments, Tensor* bags, Tensor* bag_weights) const;
};

#if GOOGLE_CUDA
// Defined in cuda/gpu_functors.cc (an int32 inverse only).
template <typename Split>
struct CombineCoefficients<GPUDevice, Split> {
  TFDE_COMBINE_COEFFICIENTS_SIGNATURE;
};
template <typename T, typename Split>
struct EmbeddingCombine<GPUDevice, T, Split> {
  TFDE_EMBEDDING_COMBINE_SIGNATURE;
};
template <typename T>
struct EmbeddingCombineGrad<GPUDevice, T> {
  TFDE_EMBEDDING_COMBINE_GRAD_SIGNATURE;
};
#endif  // GOOGLE_CUDA

}  // namespace functor

// Samples [b0, b1) of CombineRows: out[b] = the sum over ids i of sample b
// of coefficient_i * row_of(inverse[i]), coefficient_i = float(w_i *
// SampleScale(sample b)) computed as the loop goes (no pass of its own),
// each id's row prefetched a few ids ahead. kDim > 0 is the rows' width
// known when compiled: the sample's sums then stay in registers (in memory
// for a width known only at run time, 0, which costs about twice as much
// per id). kUnit: every coefficient is 1 (an unweighted sum), and the
// product is skipped (x * 1 is x: the same bits). Compiled for AVX2 and
// for baseline x86-64 (TFDE_VECTOR_CLONES), whichever the machine runs,
// without fused multiply-add: each product and sum rounds as in the
// baseline build, so the outputs are the same bits on every machine (and
// as the stock-TF serving path's).
template <int kDim, bool kUnit, typename T, typename Split, typename RowOf>
TFDE_VECTOR_CLONES __attribute__((optimize("fp-contract=off"))) void CombineSamples(
    const Split* splits, int64_t b0, int64_t b1, const int32_t* inverse,
    const float* weights, Combiner combiner, int64_t runtime_dim, const RowOf& row_of,
    T* out) {
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  RowScratch<kDim> scratch(dim);
  float* acc = scratch.data();
  const int64_t last = splits[b1];
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t d = 0; d < dim; ++d) acc[d] = 0.0f;
    const double scale = kUnit ? 1.0 : SampleScale(weights, splits[b], splits[b + 1], combiner);
    for (Split i = splits[b]; i < splits[b + 1]; ++i) {
      if (i + kCombinePrefetchDistance < last) {
        PrefetchRow(row_of(inverse[i + kCombinePrefetchDistance]), dim * sizeof(T), false);
      }
      const T* row = row_of(inverse[i]);
      if (kUnit) {
        for (int64_t d = 0; d < dim; ++d) acc[d] += static_cast<float>(row[d]);
      } else {
        const float w = static_cast<float>((weights ? weights[i] : 1.0) * scale);
        for (int64_t d = 0; d < dim; ++d) acc[d] += w * static_cast<float>(row[d]);
      }
    }
    T* o = out + b * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(acc[d]);
  }
}

// The CPU combine loop shared by EmbeddingCombine and CombineFromTables
// (`c` from CombineCoefficients, for a combine only or not), in parallel
// over samples (CombineSamples, specialized for the common widths).
template <typename T, typename Split, typename RowOf>
void CombineRows(OpKernelContext* ctx, const Tensor& splits_t, const Coefficients& c,
                 int64_t dim, const RowOf& row_of, T* out) {
  const int32_t* inverse = c.inverse;
  const Split* splits = splits_t.flat<Split>().data();
  const int64_t batch = splits_t.NumElements() - 1;
  const int64_t n = static_cast<int64_t>(splits[batch]);
  const int64_t cost = (batch ? n / batch + 1 : 1) * dim * 2;
  const auto run = [&](auto width, auto unit) {
    ParallelFor(ctx, batch, cost, [&](int64_t b0, int64_t b1) {
      CombineSamples<decltype(width)::value, decltype(unit)::value, T, Split, RowOf>(
          splits, b0, b1, inverse, c.weights, c.combiner, dim, row_of, out);
    });
  };
  const auto with_width = [&](auto unit) {
    WithCompiledWidth(dim, [&](auto width) { run(width, unit); });
  };
  if (c.unit_coefficients()) {
    with_width(std::true_type());
  } else {
    with_width(std::false_type());
  }
}

// The checks and coefficients of a ragged batch for the op classes: runs
// CombineCoefficients on the device and turns its findings into the ops'
// InvalidArgument, written once for every device.
template <typename Device, typename Split>
Status PrepareCoefficients(OpKernelContext* ctx, const Tensor& inverse, const Tensor& splits,
                           const Tensor& weights, int64_t num_rows, Combiner combiner,
                           Coefficients* out) {
  RaggedBatchErrors bad;
  TF_RETURN_IF_ERROR(functor::CombineCoefficients<Device, Split>()(
      ctx, inverse, splits, weights, num_rows, combiner, out, &bad));
  const auto split = [&](int64_t b) {
    return static_cast<int64_t>(functor::ReadElement<Device, Split>()(ctx, splits, b));
  };
  if (bad.split == 0) return InvalidArgument("row_splits[0] must be 0, got ", split(0));
  if (bad.split > 0) {
    const int64_t b = bad.split, value = split(b), before = split(b - 1);
    if (value < before) {
      return InvalidArgument("row_splits must be non-decreasing: row_splits[", b, "] = ",
                             value, " < row_splits[", b - 1, "] = ", before);
    }
    return InvalidArgument("row_splits[-1] = ", value, " must equal the number of ids, ",
                           inverse.NumElements());
  }
  if (bad.inverse >= 0) {
    const int64_t i = bad.inverse;
    const int64_t value =
        inverse.dtype() == tensorflow::DT_INT64
            ? functor::ReadElement<Device, int64_t>()(ctx, inverse, i)
            : static_cast<int64_t>(functor::ReadElement<Device, int32_t>()(ctx, inverse, i));
    return InvalidArgument("inverse[", i, "] = ", value, " is out of range [0, ",
                           IndexBound(num_rows), ")");
  }
  return absl::OkStatus();
}

}  // namespace tfde

#endif  // TFDE_KERNELS_COMBINE_FUNCTOR_H_
