// The sparse optimizers' per-row formulas (Keras 3's update rules), shared
// by the kernels that update static table variables
// (sparse_optimizer_ops.cc) and dynamic hash tables (dynamic_table_ops.cc).
//
// Each Update has kNumVars (the table and its slots), kSlotWidth (the
// slots' row width: 0 for the table's, as element-wise optimizers keep one
// slot value per element; 1 for a row-wise optimizer's one value per row),
// a Params struct read from the op's scalar inputs in every Compute
// (kernels run concurrently, so nothing per call is kept in the kernel), and
// Row(), which updates one row: rows[0] is the table row, rows[1..] the slot
// rows.
#ifndef TFDE_KERNELS_SPARSE_UPDATES_H_
#define TFDE_KERNELS_SPARSE_UPDATES_H_

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"
#include "kernel_params.h"

namespace tfde {

inline Status ReadScalar(OpKernelContext* ctx, int input, const char* name, float* out) {
  const Tensor& t = ctx->input(input);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return InvalidArgument(name, " must be a scalar, got shape ",
                           t.shape().DebugString());
  }
  *out = t.scalar<float>()();
  return absl::OkStatus();
}

// rows[0] is the table row, rows[1..] the slot rows, in input order.
struct SgdUpdate {
  static constexpr int64_t kSlotWidth = 0;
  static constexpr int kNumVars = 1;
  using Params = SgdParams;
  static Status ReadParams(OpKernelContext* ctx, int first, Params* p) {
    return ReadScalar(ctx, first, "learning_rate", &p->lr);
  }
  static void Row(const Params& p, float* const* rows, const float* g,
                  int64_t dim) {
    float* w = rows[0];
    for (int64_t d = 0; d < dim; ++d) w[d] -= p.lr * g[d];
  }
};

struct AdagradUpdate {
  static constexpr int64_t kSlotWidth = 0;
  static constexpr int kNumVars = 2;
  using Params = AdagradParams;
  static Status ReadParams(OpKernelContext* ctx, int first, Params* p) {
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first, "learning_rate", &p->lr));
    return ReadScalar(ctx, first + 1, "epsilon", &p->epsilon);
  }
  static void Row(const Params& p, float* const* rows, const float* g,
                  int64_t dim) {
    float* w = rows[0];
    float* acc = rows[1];
    for (int64_t d = 0; d < dim; ++d) {
      acc[d] += g[d] * g[d];
      w[d] -= p.lr * g[d] / std::sqrt(acc[d] + p.epsilon);
    }
  }
};

// The sum of g[d]^2 over a row, in float, in kLanes interleaved partial
// sums: a sum in order is one chain of dependent adds the compiler may not
// reorder, which cost more than the rest of row-wise Adagrad's update.
inline float SumOfSquares(const float* g, int64_t dim) {
  constexpr int kLanes = 16;
  float partial[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    for (int k = 0; k < kLanes; ++k) partial[k] += g[d + k] * g[d + k];
  }
  // d is a multiple of kLanes here, so g[d + k] goes to partial[k], as in a
  // full block.
  for (int k = 0; k < kLanes && d + k < dim; ++k) partial[k] += g[d + k] * g[d + k];
  float sum = 0.0f;
  for (float p : partial) sum += p;
  return sum;
}

// FBGEMM's EXACT_ROWWISE_ADAGRAD (TorchRec's RowWiseAdagrad): one
// accumulator per row gathers the mean of the row's squared gradient, and
// the whole row steps by lr / (sqrt(accumulator) + epsilon).
struct RowwiseAdagradUpdate {
  static constexpr int64_t kSlotWidth = 1;
  static constexpr int kNumVars = 2;
  using Params = AdagradParams;
  static Status ReadParams(OpKernelContext* ctx, int first, Params* p) {
    return AdagradUpdate::ReadParams(ctx, first, p);
  }
  static void Row(const Params& p, float* const* rows, const float* g,
                  int64_t dim) {
    float* w = rows[0];
    float* acc = rows[1];
    *acc += SumOfSquares(g, dim) / static_cast<float>(dim);
    const float multiplier = p.lr / (std::sqrt(*acc) + p.epsilon);
    for (int64_t d = 0; d < dim; ++d) w[d] -= g[d] * multiplier;
  }
};

// The width of an Update's slot rows in a table of `dim` columns.
template <typename Update>
constexpr int64_t SlotWidth(int64_t dim) {
  return Update::kSlotWidth == 0 ? dim : Update::kSlotWidth;
}

struct LazyAdamUpdate {
  static constexpr int64_t kSlotWidth = 0;
  static constexpr int kNumVars = 3;
  using Params = LazyAdamParams;
  static Status ReadParams(OpKernelContext* ctx, int first, Params* p) {
    float lr, beta_1, beta_2, epsilon, step;
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first, "learning_rate", &lr));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 1, "beta_1", &beta_1));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 2, "beta_2", &beta_2));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 3, "epsilon", &epsilon));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 4, "step", &step));
    if (!(step >= 1.0f)) {
      return InvalidArgument("step must be >= 1 (1-based), got ", step);
    }
    *p = MakeLazyAdamParams(lr, beta_1, beta_2, epsilon, step);
    return absl::OkStatus();
  }
  static void Row(const Params& p, float* const* rows, const float* g,
                  int64_t dim) {
    float* w = rows[0];
    float* m = rows[1];
    float* v = rows[2];
    for (int64_t d = 0; d < dim; ++d) {
      m[d] += (g[d] - m[d]) * (1.0f - p.beta_1);
      v[d] += (g[d] * g[d] - v[d]) * (1.0f - p.beta_2);
      w[d] -= m[d] * p.alpha / (std::sqrt(v[d]) + p.epsilon);
    }
  }
};

struct FtrlUpdate {
  static constexpr int64_t kSlotWidth = 0;
  static constexpr int kNumVars = 3;
  using Params = FtrlParams;
  static Status ReadParams(OpKernelContext* ctx, int first, Params* p) {
    float lr, l1, l2, l2_shrinkage, beta, power;
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first, "learning_rate", &lr));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 1, "l1", &l1));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 2, "l2", &l2));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 3, "l2_shrinkage", &l2_shrinkage));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 4, "beta", &beta));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, first + 5, "learning_rate_power", &power));
    if (!(lr > 0.0f)) {
      return InvalidArgument("learning_rate must be positive, got ", lr);
    }
    *p = MakeFtrlParams(lr, l1, l2, l2_shrinkage, beta, power);
    return absl::OkStatus();
  }
  static void Row(const Params& p, float* const* rows, const float* g,
                  int64_t dim) {
    float* w = rows[0];
    float* acc = rows[1];
    float* linear = rows[2];
    for (int64_t d = 0; d < dim; ++d) {
      const float grad_to_use = g[d] + 2.0f * p.l2_shrinkage * w[d];
      const float new_acc = acc[d] + g[d] * g[d];
      const float new_acc_pow = std::pow(new_acc, -p.lr_power);
      linear[d] += grad_to_use -
                   (new_acc_pow - std::pow(acc[d], -p.lr_power)) / p.lr * w[d];
      const float quadratic = new_acc_pow / p.lr + 2.0f * p.l2_total;
      const float clipped = std::min(std::max(linear[d], -p.l1), p.l1);
      w[d] = (clipped - linear[d]) / quadratic;
      acc[d] = new_acc;
    }
  }
};

// Applies Update to entries [begin, end) of a list: `rows_of(i, rows)` sets
// the variables' row pointers of entry i (table row first, then slots) and
// returns false for an entry without a row; `grad_of(i, scratch)` returns
// its gradient row, written to `scratch` (dim floats) if it must be
// computed. The rows of entries a few ahead are prefetched: a table's rows
// are visited in no predictable order. kDim > 0 is dim known when compiled
// (WithCompiledWidth), which Update::Row then loops over.
template <typename Update, int kDim = 0, typename GradOf, typename RowsOf>
TFDE_VECTOR_CLONES TFDE_NO_UNROLL_AND_JAM void UpdateRows(const typename Update::Params& params,
                                                          int64_t begin, int64_t end,
                                                          int64_t runtime_dim,
                                                          const GradOf& grad_of,
                                                          const RowsOf& rows_of) {
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  float* rows[Update::kNumVars];
  // A computed gradient row, which may stay in registers from grad_of to
  // Update::Row where the width is known.
  RowScratch<kDim> row_scratch(dim);
  float* scratch = row_scratch.data();
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchDistance < end && rows_of(i + kPrefetchDistance, rows)) {
      for (int v = 0; v < Update::kNumVars; ++v) {
        PrefetchRow(rows[v], (v == 0 ? dim : SlotWidth<Update>(dim)) * sizeof(float), true);
      }
    }
    if (!rows_of(i, rows)) continue;
    Update::Row(params, rows, grad_of(i, scratch), dim);
  }
}

}  // namespace tfde

#endif  // TFDE_KERNELS_SPARSE_UPDATES_H_
