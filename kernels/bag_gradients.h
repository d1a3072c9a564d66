// Row gradients kept as the ids that read each row (a "bag gradient"), so
// the backward of a lookup can feed an optimizer without writing a
// [num_unique, dim] gradient matrix first (TorchRec/FBGEMM's fused
// backward-optimizer does the same):
//
//   grad(row k) = sum over j in [segments[k], segments[k+1]) of
//                 bag_weights[j] * output_grad[bags[j]]
//
// `output_grad` is the lookup's [batch, dim] output gradient, `bags` the
// sample each id belongs to and `bag_weights` the id's coefficient (its
// weight over the combiner's divisor), listed row by row. Entries of a row
// keep the ids' order, so the sum is deterministic and, on one machine,
// equal to TfdeEmbeddingCombineGrad's (both are compiled for AVX2 and FMA
// as well as baseline x86-64; a weighted sum may round differently between
// the two builds).
#ifndef TFDE_KERNELS_BAG_GRADIENTS_H_
#define TFDE_KERNELS_BAG_GRADIENTS_H_

#include <algorithm>
#include <limits>
#include <vector>

#include "common.h"

namespace tfde {

// Lists entries row by row: entry i (of n) belongs to row inverse[i] and
// goes to the next free place of that row's segment; `place(i, j)` stores
// entry i at j. A stable counting sort, written straight into the
// segments it returns (num_rows + 1 entries), without a cursor array.
template <typename Place>
void GroupByRow(const int32_t* inverse, int64_t n, int64_t num_rows, int64_t* segments,
                const Place& place) {
  // segments[k + 1] counts row k, then (prefix sum) is where row k ends.
  std::fill(segments, segments + num_rows + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++segments[inverse[i] + 1];
  for (int64_t k = 0; k < num_rows; ++k) segments[k + 1] += segments[k];
  // segments[k] serves as row k's cursor and ends at row k's end...
  for (int64_t i = 0; i < n; ++i) place(i, segments[inverse[i]]++);
  // ... which is row k + 1's start: shift back by one.
  for (int64_t k = num_rows; k > 0; --k) segments[k] = segments[k - 1];
  segments[0] = 0;
}

// GroupByRow on the op's thread pool, with the same lists: the entries in
// `parts` blocks, in order, each counting its rows and then placing its
// entries from a cursor of its own per row, which starts after the places
// of the blocks before it. The cursors are parts * num_rows int32 and the
// prefix sum over them is serial, so parts is capped to keep both within
// 4 * n: a huge row space with few ids per row stays serial, as does a
// batch too small to split (under two blocks of 2^16 entries) or too large
// for int32 cursors.
template <typename Place>
Status GroupByRowInParallel(OpKernelContext* ctx, const int32_t* inverse, int64_t n,
                            int64_t num_rows, int64_t* segments, const Place& place) {
  const int64_t parts =
      n > std::numeric_limits<int32_t>::max()
          ? 1
          : std::min({static_cast<int64_t>(NumWorkerThreads(ctx)), n >> 16,
                      4 * n / std::max<int64_t>(num_rows, 1)});
  if (parts < 2) {
    GroupByRow(inverse, n, num_rows, segments, place);
    return absl::OkStatus();
  }
  const Blocks blocks{n, parts};
  // Block p's counts of each row, then its cursors.
  Tensor cursors_t;
  int32_t* cursors;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, parts * num_rows, &cursors_t, &cursors));
  ParallelFor(ctx, parts, n / parts * 4, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int32_t* count = cursors + p * num_rows;
      std::fill(count, count + num_rows, 0);
      for (int64_t i = blocks.Begin(p); i < blocks.Begin(p + 1); ++i) ++count[inverse[i]];
    }
  });
  int64_t next = 0;
  for (int64_t k = 0; k < num_rows; ++k) {
    segments[k] = next;
    for (int64_t p = 0; p < parts; ++p) {
      int32_t& cursor = cursors[p * num_rows + k];
      const int32_t count = cursor;
      cursor = static_cast<int32_t>(next);
      next += count;
    }
  }
  segments[num_rows] = next;
  ParallelFor(ctx, parts, n / parts * 8, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int32_t* cursor = cursors + p * num_rows;
      for (int64_t i = blocks.Begin(p); i < blocks.Begin(p + 1); ++i) {
        place(i, cursor[inverse[i]]++);
      }
    }
  });
  return absl::OkStatus();
}

// A validated view of the four bag-gradient tensors.
template <typename T>
struct BagGradients {
  const T* output_grad = nullptr;
  int64_t num_bags = 0;
  int64_t dim = 0;
  const int64_t* segments = nullptr;
  int64_t num_rows = 0;  // segments has num_rows + 1 entries
  const int32_t* bags = nullptr;
  const float* weights = nullptr;

  // Checks the entries row k reads: its segment lies inside [0, entries)
  // in order, and its bags are rows of output_grad.
  Status CheckRow(int64_t k) const {
    const int64_t begin = segments[k], end = segments[k + 1];
    if (begin < 0 || end > segments[num_rows]) {
      return InvalidArgument("segments[", k, "] = ", begin, " and segments[", k + 1,
                             "] = ", end, " leave [0, ", segments[num_rows], ")");
    }
    if (end < begin) {
      return InvalidArgument("segments must be non-decreasing: segments[", k + 1, "] = ",
                             end, " < segments[", k, "] = ", begin);
    }
    for (int64_t j = begin; j < end; ++j) {
      if (bags[j] < 0 || bags[j] >= num_bags) {
        return InvalidArgument("bags[", j, "] = ", bags[j], " is out of range [0, ",
                               num_bags, ")");
      }
    }
    return absl::OkStatus();
  }

  // Writes row k's gradient to out[0, dim), which must not overlap
  // output_grad. kDim > 0 is dim known when compiled (WithCompiledWidth):
  // where `out` is the caller's local array, the sums then stay in
  // registers while the row's entries are read. Always inlined, so the sum
  // is compiled for its caller's instruction set (TFDE_VECTOR_CLONES); its
  // callers also keep GCC from jamming two entries into one scalar loop
  // (TFDE_NO_UNROLL_AND_JAM).
  template <int kDim = 0>
  __attribute__((always_inline)) void Row(int64_t k, float* out) const {
    const int64_t width = kDim > 0 ? kDim : dim;
    std::fill(out, out + width, 0.0f);
    const int64_t entries = segments[num_rows];
    for (int64_t j = segments[k]; j < segments[k + 1]; ++j) {
      // The output-gradient rows of a segment are samples anywhere in the
      // batch: each is asked for a few entries ahead (past this segment,
      // those of the rows that usually come next). An update checks only
      // its own rows' bags, so a bag ahead is used only if in range.
      if (j + kCombinePrefetchDistance < entries) {
        const int32_t ahead = bags[j + kCombinePrefetchDistance];
        if (static_cast<uint64_t>(ahead) < static_cast<uint64_t>(num_bags)) {
          PrefetchRow(output_grad + static_cast<int64_t>(ahead) * width,
                      width * sizeof(T), false);
        }
      }
      const float c = weights[j];
      const T* g = output_grad + static_cast<int64_t>(bags[j]) * width;
      for (int64_t d = 0; d < width; ++d) out[d] += c * static_cast<float>(g[d]);
    }
  }
};

// Checks shapes and the segments' ends. The values of a row's entries are
// checked by CheckRow, for the rows a caller reads: the tables of a group
// share one set of bags, and each update reads only its own rows.
template <typename T>
Status ReadBagGradients(const Tensor& output_grad, const Tensor& segments,
                        const Tensor& bags, const Tensor& weights,
                        BagGradients<T>* out) {
  if (output_grad.dims() != 2) {
    return InvalidArgument("output_grad must be a matrix, got shape ",
                           output_grad.shape().DebugString());
  }
  if (segments.dims() != 1 || bags.dims() != 1 || weights.dims() != 1) {
    return InvalidArgument("segments, bags and bag_weights must be vectors, got shapes ",
                           segments.shape().DebugString(), ", ", bags.shape().DebugString(),
                           ", ", weights.shape().DebugString());
  }
  if (segments.NumElements() < 1) {
    return InvalidArgument("segments must have at least one element");
  }
  const int64_t entries = bags.NumElements();
  if (weights.NumElements() != entries) {
    return InvalidArgument("bag_weights has ", weights.NumElements(),
                           " elements but bags has ", entries);
  }
  out->output_grad = output_grad.flat<T>().data();
  out->num_bags = output_grad.dim_size(0);
  out->dim = output_grad.dim_size(1);
  out->segments = segments.flat<int64_t>().data();
  out->num_rows = segments.NumElements() - 1;
  out->bags = bags.flat<int32_t>().data();
  out->weights = weights.flat<float>().data();
  if (out->segments[0] != 0) {
    return InvalidArgument("segments[0] must be 0, got ", out->segments[0]);
  }
  if (out->segments[out->num_rows] != entries) {
    return InvalidArgument("segments[-1] = ", out->segments[out->num_rows],
                           " must equal the number of bag entries, ", entries);
  }
  return absl::OkStatus();
}

}  // namespace tfde

#endif  // TFDE_KERNELS_BAG_GRADIENTS_H_
