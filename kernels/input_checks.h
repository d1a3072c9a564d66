// Input checks shared by the op classes (for every device) and the dynamic
// tables' updates, so every device raises the same InvalidArgument for the
// same mistake. Only shapes and host scalars here; checks of tensor contents
// run in the functors, where the data is (device.h).
#ifndef TFDE_KERNELS_INPUT_CHECKS_H_
#define TFDE_KERNELS_INPUT_CHECKS_H_

#include <limits>
#include <string>

#include <vector>

#include "common.h"
#include "kernel_params.h"

namespace tfde {

inline Status ParseCombiner(const std::string& name, Combiner* combiner) {
  if (name == "sum") {
    *combiner = Combiner::kSum;
  } else if (name == "mean") {
    *combiner = Combiner::kMean;
  } else if (name == "sqrtn") {
    *combiner = Combiner::kSqrtn;
  } else {
    return InvalidArgument("combiner must be one of sum, mean, sqrtn; got '", name, "'");
  }
  return absl::OkStatus();
}

// The combiner attribute of an op.
inline Status ReadCombiner(OpKernelConstruction* ctx, Combiner* combiner) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("combiner", &name));
  return ParseCombiner(name, combiner);
}

// A vector of ids whose positions fit the int32 indices the ops return.
inline Status CheckIdVector(const Tensor& ids, const char* name = "ids") {
  if (ids.dims() != 1) {
    return InvalidArgument(name, " must be a vector, got shape ", ids.shape().DebugString());
  }
  if (ids.NumElements() >= std::numeric_limits<int32_t>::max()) {
    return InvalidArgument(name, " has ", ids.NumElements(),
                           " elements; at most 2^31 - 2 are supported");
  }
  return absl::OkStatus();
}

// A scalar input of an index type (int32 or int64, as its op's attribute
// allows), read without narrowing.
inline Status ReadIndexScalar(const Tensor& t, const char* name, int64_t* out) {
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return InvalidArgument(name, " must be a scalar, got shape ", t.shape().DebugString());
  }
  *out = t.dtype() == tensorflow::DT_INT64 ? t.scalar<int64_t>()()
                                           : static_cast<int64_t>(t.scalar<int32_t>()());
  return absl::OkStatus();
}

inline Status ReadNumShards(const Tensor& t, int32_t* num_shards) {
  int64_t value;
  TF_RETURN_IF_ERROR(ReadIndexScalar(t, "num_shards", &value));
  if (value <= 0) return InvalidArgument("num_shards must be positive, got ", value);
  if (value > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("num_shards = ", value, " is too large; at most 2^31 - 1 shards");
  }
  *num_shards = static_cast<int32_t>(value);
  return absl::OkStatus();
}

inline Status ReadInt64Scalar(OpKernelContext* ctx, int input, const char* name,
                              int64_t* out) {
  const Tensor& t = ctx->input(input);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return InvalidArgument(name, " must be a scalar, got shape ", t.shape().DebugString());
  }
  *out = t.scalar<int64_t>()();
  return absl::OkStatus();
}

// A ragged batch of ids: vectors of inverse indices, row splits and
// weights (none, or one per id).
inline Status CheckRaggedInputs(const Tensor& inverse, const Tensor& splits,
                                const Tensor& weights) {
  if (inverse.dims() != 1 || splits.dims() != 1 || weights.dims() != 1) {
    return InvalidArgument("inverse, row_splits and weights must be vectors, got shapes ",
                           inverse.shape().DebugString(), ", ",
                           splits.shape().DebugString(), ", ", weights.shape().DebugString());
  }
  if (splits.NumElements() < 1) {
    return InvalidArgument("row_splits must have at least one element");
  }
  const int64_t n = inverse.NumElements();
  if (weights.NumElements() != 0 && weights.NumElements() != n) {
    return InvalidArgument("weights has ", weights.NumElements(), " elements but there are ",
                           n, " ids; pass one weight per id or none");
  }
  return absl::OkStatus();
}

// Row splits of a ragged input over `num_ids` ids, read in host memory:
// they start at 0, never decrease and end at `num_ids`; otherwise an
// InvalidArgument naming `what` (the feature and table, or the input) and
// the first bad split (TfdeCheckRowSplits, TfdeSampleKeys).
template <typename Split>
Status CheckRowSplitsOver(const Tensor& splits_t, int64_t num_ids, const std::string& what) {
  if (splits_t.dims() != 1) {
    return InvalidArgument(what, ": row splits must be a vector, got shape ",
                           splits_t.shape().DebugString());
  }
  const int64_t n = splits_t.NumElements();
  const Split* splits = splits_t.flat<Split>().data();
  const std::string bad = what +
                          ": ragged ids have row splits that do not start at 0, never "
                          "decrease and end at the number of ids: ";
  if (n == 0) return InvalidArgument(bad, "there are none");
  if (splits[0] != 0) return InvalidArgument(bad, "row_splits[0] = ", splits[0]);
  for (int64_t b = 1; b < n; ++b) {
    if (splits[b] < splits[b - 1]) {
      return InvalidArgument(bad, "row_splits[", b, "] = ", splits[b], " < row_splits[", b - 1,
                             "] = ", splits[b - 1]);
    }
  }
  if (static_cast<int64_t>(splits[n - 1]) != num_ids) {
    return InvalidArgument(bad, "row_splits[", n - 1, "] = ", splits[n - 1], " but there are ",
                           num_ids, " ids");
  }
  return absl::OkStatus();
}

// Combine and its gradient: a [rows, dim] matrix (`name`) and a ragged batch.
inline Status CheckCombineInputs(const Tensor& table_like, const char* name,
                                 const Tensor& inverse, const Tensor& splits,
                                 const Tensor& weights) {
  if (table_like.dims() != 2) {
    return InvalidArgument(name, " must be a matrix, got shape ",
                           table_like.shape().DebugString());
  }
  return CheckRaggedInputs(inverse, splits, weights);
}

// The number of unique rows a combine's gradient produces.
inline Status ReadNumUnique(const Tensor& num_unique_t, int64_t* num_unique) {
  TF_RETURN_IF_ERROR(ReadIndexScalar(num_unique_t, "num_unique", num_unique));
  if (*num_unique < 0) return InvalidArgument("num_unique must be >= 0, got ", *num_unique);
  return absl::OkStatus();
}

// The gradient of combine: also the [batch, dim] output gradient and the
// number of unique rows to produce.
inline Status CheckCombineGradInputs(const Tensor& grad, const Tensor& inverse,
                                     const Tensor& splits, const Tensor& weights,
                                     const Tensor& num_unique_t, int64_t* num_unique) {
  TF_RETURN_IF_ERROR(CheckCombineInputs(grad, "grad", inverse, splits, weights));
  TF_RETURN_IF_ERROR(ReadNumUnique(num_unique_t, num_unique));
  const int64_t batch = splits.NumElements() - 1;
  if (grad.dim_size(0) != batch) {
    return InvalidArgument("grad has ", grad.dim_size(0), " rows but row_splits describes ",
                           batch, " samples");
  }
  return absl::OkStatus();
}

// A sparse update's `ids` (named `what`), the number of gradient rows it
// reads from, and grad_rows (empty: gradient row i belongs to ids[i]; else
// gradient row grad_rows[i]).
inline Status CheckUpdateInputs(const Tensor& ids, int64_t grad_num_rows,
                                const Tensor& grad_rows, const char* what, bool* select) {
  if (ids.dims() != 1) {
    return InvalidArgument(what, " must be a vector, got shape ", ids.shape().DebugString());
  }
  if (grad_rows.dims() != 1) {
    return InvalidArgument("grad_rows must be a vector, got shape ",
                           grad_rows.shape().DebugString());
  }
  const int64_t n = ids.NumElements();
  *select = grad_rows.NumElements() > 0;
  // No rows: nothing to read, whatever the gradient (a table of a fused
  // group that no id of this step touched gets an empty grad_rows).
  if (n == 0) return absl::OkStatus();
  if (*select ? grad_rows.NumElements() != n : grad_num_rows != n) {
    return InvalidArgument("grad has ", grad_num_rows, " rows and grad_rows ",
                           grad_rows.NumElements(), " entries but there are ", n, " ", what);
  }
  return absl::OkStatus();
}

// The same for a [k, dim] gradient matrix.
inline Status CheckUpdateInputs(const Tensor& ids, const Tensor& grad, const Tensor& grad_rows,
                                const char* what, bool* select) {
  if (grad.dims() != 2) {
    return InvalidArgument("grad must be a matrix, got shape ", grad.shape().DebugString());
  }
  return CheckUpdateInputs(ids, grad.dim_size(0), grad_rows, what, select);
}

}  // namespace tfde

#endif  // TFDE_KERNELS_INPUT_CHECKS_H_
