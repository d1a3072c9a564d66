// TfdeSortedUniqueInRange: the unique ids of a vector whose ids lie in
// [0, num_ids), in increasing order, and each element's index into them.
//
// A static group's dedups use it where the bitmap is cheap
// (`ops.unique_rows`): the backward of a one-owner step, the forward's
// fused ids (whose space is the fused rows times the replicas) and each
// owner's requests at several replicas. Their ids are row numbers, so a
// bitmap of that
// space (num_ids / 8 bytes, a 1/2048 of a 64-wide float32 table) replaces
// TfdeUniqueWithCounts's hash map: one pass sets the bits, a prefix count
// of the words ranks them, and every id's index is its rank. The unique ids
// come out in row order, so the optimizer that follows walks each table's
// rows in address order (about a third less time for the bench's lazy Adam
// rows than in first-appearance order, bench/ops_bench.py). Where the range
// is far wider than the ids, (id, position) pairs are sorted instead.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "common.h"
#include "device.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfde {

REGISTER_OP("TfdeSortedUniqueInRange")
    .Input("ids: T")
    .Output("unique: T")
    .Output("inverse: int32")
    .Attr("T: {int32, int64}")
    .Attr("num_ids: int >= 0")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, ids);
      return absl::OkStatus();
    })
    .Doc(R"doc(
The unique values of `ids` in increasing order, and `inverse` with
ids[i] == unique[inverse[i]]. Every id must lie in [0, num_ids); the
kernel keeps a bitmap of that range, or sorts where the range is far wider
than the ids.
)doc");

template <typename Id>
class SortedUniqueInRangeOp : public OpKernel {
 public:
  explicit SortedUniqueInRangeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_ids", &num_ids_));
    // INT64_MAX is FindOutOfRange's "unbounded".
    OP_REQUIRES(ctx, num_ids_ < std::numeric_limits<int64_t>::max(),
                InvalidArgument("num_ids must be below 2^63 - 1, got ", num_ids_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    OP_REQUIRES(ctx, ids_t.dims() == 1,
                InvalidArgument("ids must be a vector, got shape ",
                                ids_t.shape().DebugString()));
    const int64_t n = ids_t.NumElements();
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                InvalidArgument("ids has ", n, " elements; int32 inverse indices address "
                                "at most 2^31 - 1"));
    int64_t bad;
    OP_REQUIRES_OK(ctx, functor::FindOutOfRange<CPUDevice, Id>()(ctx, ids_t, 0, num_ids_, &bad));
    const Id* ids = ids_t.flat<Id>().data();
    OP_REQUIRES(ctx, bad < 0,
                InvalidArgument("ids[", bad, "] = ", bad < 0 ? 0 : ids[bad],
                                " is out of range [0, ", num_ids_, ")"));

    // The ids present, one bit each; then, per word, how many are present
    // in the words before it: an id's rank among the unique ids.
    // A range much wider than the ids (say, few ids of a huge table) would
    // make the bitmap outweigh them: sort instead, in O(n) memory.
    // (num_ids_ + 63) / 64 would overflow for a range near 2^63.
    const int64_t num_words = n == 0 ? 0 : num_ids_ / 64 + (num_ids_ % 64 != 0);
    if (num_words > 4 * n + 1024) {
      SortPositions(ctx, ids, n);
      return;
    }
    // Each worker sets the bits of one range of words, scanning every id:
    // no atomics, and the ids outside its range write to a spare word of
    // its own (past num_words), so the loop has no branch to mispredict.
    const int64_t num_parts =
        std::max<int64_t>(1, std::min<int64_t>(NumWorkerThreads(ctx), num_words / 1024));
    std::vector<uint64_t> present(num_words + num_parts, 0);
    ParallelFor(ctx, num_parts, n * 2, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = num_words * p / num_parts, hi = num_words * (p + 1) / num_parts;
        const int64_t spare = num_words + p;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t w = ids[i] >> 6;
          present[w >= lo && w < hi ? w : spare] |= uint64_t{1} << (ids[i] & 63);
        }
      }
    });
    std::vector<int32_t> ranked_before(num_words);
    int64_t num_unique = 0;
    for (int64_t w = 0; w < num_words; ++w) {
      ranked_before[w] = static_cast<int32_t>(num_unique);
      num_unique += Popcount(present[w]);
    }

    Id* unique;
    int32_t* inverse;
    OP_REQUIRES_OK(ctx, AllocateOutputs(ctx, num_unique, n, &unique, &inverse));
    // Words in parallel: each writes its ids from its own rank on.
    ParallelFor(ctx, num_words, 64, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        int32_t k = ranked_before[w];
        for (uint64_t bits = present[w]; bits != 0; bits &= bits - 1) {
          unique[k++] = static_cast<Id>(w * 64 + __builtin_ctzll(bits));
        }
      }
    });
    ParallelFor(ctx, n, 8, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t id = ids[i];
        const uint64_t below = (uint64_t{1} << (id & 63)) - 1;
        inverse[i] = ranked_before[id >> 6] +
                     static_cast<int32_t>(Popcount(present[id >> 6] & below));
      }
    });
  }

 private:
  static Status AllocateOutputs(OpKernelContext* ctx, int64_t num_unique, int64_t n, Id** unique,
                                int32_t** inverse) {
    Tensor *unique_t, *inverse_t;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({num_unique}), &unique_t));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &inverse_t));
    *unique = unique_t->flat<Id>().data();
    *inverse = inverse_t->flat<int32_t>().data();
    return absl::OkStatus();
  }

  // The unique ids and inverse by sorting (id, position) pairs.
  void SortPositions(OpKernelContext* ctx, const Id* ids, int64_t n) {
    std::vector<std::pair<Id, int32_t>> sorted(n);
    for (int64_t i = 0; i < n; ++i) sorted[i] = {ids[i], static_cast<int32_t>(i)};
    std::sort(sorted.begin(), sorted.end());
    int64_t num_unique = 0;
    for (int64_t k = 0; k < n; ++k) num_unique += k == 0 || sorted[k].first != sorted[k - 1].first;
    Id* unique;
    int32_t* inverse;
    OP_REQUIRES_OK(ctx, AllocateOutputs(ctx, num_unique, n, &unique, &inverse));
    int32_t rank = -1;
    for (int64_t k = 0; k < n; ++k) {
      if (k == 0 || sorted[k].first != sorted[k - 1].first) unique[++rank] = sorted[k].first;
      inverse[sorted[k].second] = rank;
    }
  }

  // The wheels' baseline x86-64 has no popcnt instruction: the classic
  // bit-slicing count is branch-free and inlined, where the builtin would
  // call libgcc.
  static int64_t Popcount(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return static_cast<int64_t>((x * 0x0101010101010101ULL) >> 56);
  }

  int64_t num_ids_;
};

#define REGISTER_SORTED_UNIQUE(Id)                                                            \
  REGISTER_KERNEL_BUILDER(                                                                    \
      Name("TfdeSortedUniqueInRange").Device(DEVICE_CPU).TypeConstraint<Id>("T"), \
      SortedUniqueInRangeOp<Id>);
REGISTER_SORTED_UNIQUE(int32_t);
REGISTER_SORTED_UNIQUE(int64_t);
#undef REGISTER_SORTED_UNIQUE

}  // namespace tfde
