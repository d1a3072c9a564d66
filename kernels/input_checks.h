// Input checks shared by the CPU kernels, the GPU kernels
// (cuda/gpu_op_kernels.cc) and the dynamic tables' updates, so every
// device raises the same InvalidArgument for the same mistake. Only shapes
// and host scalars here; checks of tensor contents run where the data is.
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

// An index vector (int32 or int64, as its op's attribute allows) as int32:
// every value is checked to lie in [0, bound) first, so an int64 value is
// never wrapped. An int32 input is read in place, an int64 one narrowed into
// scratch. The ops address at most 2^31 rows, so bound is at most 2^31.
struct Int32Indices {
  const int32_t* data = nullptr;
  int64_t end = 0;  // the largest value + 1 (0 when there are none)
  Tensor narrowed;  // the int32 copy of an int64 input
};

template <typename Index>
Status CheckIndexRange(const Index* values, int64_t n, const char* name, int64_t bound,
                       int64_t* end) {
  bound = std::min<int64_t>(bound, int64_t{1} << 31);
  Index largest = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (values[i] < 0 || values[i] >= bound) {
      return InvalidArgument(name, "[", i, "] = ", values[i], " is out of range [0, ", bound,
                             ")");
    }
    largest = std::max(largest, values[i]);
  }
  *end = static_cast<int64_t>(largest) + 1;
  return absl::OkStatus();
}

inline Status ReadIndices(OpKernelContext* ctx, const Tensor& t, const char* name,
                          int64_t bound, Int32Indices* out) {
  const int64_t n = t.NumElements();
  if (t.dtype() == tensorflow::DT_INT32) {
    out->data = t.flat<int32_t>().data();
    return CheckIndexRange(out->data, n, name, bound, &out->end);
  }
  const int64_t* wide = t.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(CheckIndexRange(wide, n, name, bound, &out->end));
  int32_t* narrow;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &out->narrowed, &narrow));
  for (int64_t i = 0; i < n; ++i) narrow[i] = static_cast<int32_t>(wide[i]);
  out->data = narrow;
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

// A sparse update's row indices in host memory: each in [0, num_rows) and
// none repeated. A bitmap of the table's rows is cheaper than a hash map
// while the table is not much larger than the batch (the usual case); a
// huge table with few rows gets the hash map.
template <typename Index>
Status CheckUpdateRows(const Index* indices, int64_t n, int64_t num_rows) {
  const auto out_of_range = [&](int64_t i) {
    return InvalidArgument("indices[", i, "] = ", indices[i], " is out of range [0, ",
                           num_rows, ")");
  };
  const auto repeated = [&](int64_t i, int64_t first) {
    return InvalidArgument("indices[", i, "] = ", indices[i], " repeats indices[", first,
                           "]; sum the gradients of a row before applying them");
  };
  if (num_rows <= 256 * n) {
    std::vector<uint64_t> seen((num_rows + 63) / 64, 0);
    for (int64_t i = 0; i < n; ++i) {
      const Index row = indices[i];
      if (row < 0 || row >= num_rows) return out_of_range(i);
      uint64_t& word = seen[row >> 6];
      const uint64_t bit = uint64_t{1} << (row & 63);
      if (word & bit) {
        int64_t first = 0;
        while (indices[first] != row) ++first;
        return repeated(i, first);
      }
      word |= bit;
    }
    return absl::OkStatus();
  }
  IdIndexMap<Index> seen(n);
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= num_rows) return out_of_range(i);
    bool inserted;
    const int32_t first = seen.FindOrInsert(indices[i], static_cast<int32_t>(i), &inserted);
    if (!inserted) return repeated(i, first);
  }
  return absl::OkStatus();
}

}  // namespace tfde

#endif  // TFDE_KERNELS_INPUT_CHECKS_H_
