// TfdeUniqueWithCounts: hash-based dedup of a batch's ids in O(n).
//
// Unique ids come out in order of first appearance, like tf.unique, so the
// kernel and its pure-TF twin agree element for element.
//
// Large inputs are split by hash into partitions that are deduplicated in
// parallel; each element learns the position of its id's first occurrence,
// and a prefix sum over "is first occurrence" numbers the unique ids in
// order of appearance. Every phase is linear in n.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <vector>

#include "common.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "unique_functor.h"

namespace tfde {

REGISTER_OP("TfdeUniqueWithCounts")
    .Input("ids: T")
    .Output("unique_ids: T")
    .Output("inverse: int32")
    .Output("counts: int32")
    .Attr("T: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, ids);
      c->set_output(2, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Deduplicates a vector of ids: unique_ids[inverse[i]] == ids[i], and
counts[k] is how often unique_ids[k] occurs. Unique ids are ordered by first
appearance.
)doc");

template <typename Device, typename Id>
class UniqueWithCountsOp : public OpKernel {
 public:
  explicit UniqueWithCountsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckIdVector(ids_t));
    Tensor* inverse_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ids_t.shape(), &inverse_t));
    const auto allocate = [ctx](int64_t num_unique, Tensor** unique, Tensor** counts) {
      TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({num_unique}), unique));
      return ctx->allocate_output(2, TensorShape({num_unique}), counts);
    };
    OP_REQUIRES_OK(ctx, functor::UniqueWithCounts<Device, Id>()(ctx, ids_t, inverse_t,
                                                                 allocate));
  }
};

namespace {

// Below this size the partitioning overhead outweighs the parallel gain.
constexpr int64_t kParallelThreshold = 1 << 15;

template <typename Id>
Status UniqueSequential(OpKernelContext* ctx, const Id* ids, int64_t n, int32_t* inverse,
                      const functor::AllocateUniqueOutputs& allocate) {
  IdIndexMap<Id> map(n);
  Tensor unique_t, counts_t;
  Id* unique;
  int32_t* counts;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &unique_t, &unique));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &counts_t, &counts));
  int32_t num_unique = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool inserted;
    const int32_t k = map.FindOrInsert(ids[i], num_unique, &inserted);
    if (inserted) {
      unique[k] = ids[i];
      counts[k] = 0;
      ++num_unique;
    }
    ++counts[k];
    inverse[i] = k;
  }
  Tensor *unique_out, *counts_out;
  TF_RETURN_IF_ERROR(allocate(num_unique, &unique_out, &counts_out));
  std::copy_n(unique, num_unique, unique_out->flat<Id>().data());
  std::copy_n(counts, num_unique, counts_out->flat<int32_t>().data());
  return absl::OkStatus();
}

template <typename Id>
Status UniqueParallel(OpKernelContext* ctx, const Id* ids, int64_t n, int32_t* inverse,
                    const functor::AllocateUniqueOutputs& allocate) {
  // Partition count: a few per thread so uneven partitions still balance.
  int num_partitions = 1;
  while (num_partitions < 4 * NumWorkerThreads(ctx)) num_partitions <<= 1;
  const int shift = 64 - __builtin_ctz(num_partitions);
  auto partition_of = [&](Id id) -> int {
    return static_cast<int>(MixId(static_cast<uint64_t>(id)) >> shift);
  };

  // Stable counting sort of element indices by partition, in blocks.
  const Blocks blocks{n, static_cast<int64_t>(num_partitions)};
  std::vector<int64_t> histogram(blocks.num_blocks * num_partitions, 0);
  ParallelFor(ctx, blocks.num_blocks, n / blocks.num_blocks * 8,
              [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) {
                  int64_t* h = &histogram[b * num_partitions];
                  for (int64_t i = blocks.Begin(b); i < blocks.Begin(b + 1); ++i)
                    ++h[partition_of(ids[i])];
                }
              });
  std::vector<int64_t> partition_begin(num_partitions + 1, 0);
  // offsets[b][p]: where block b writes its first element of partition p.
  std::vector<int64_t> offsets(histogram.size());
  int64_t running = 0;
  for (int p = 0; p < num_partitions; ++p) {
    partition_begin[p] = running;
    for (int64_t b = 0; b < blocks.num_blocks; ++b) {
      offsets[b * num_partitions + p] = running;
      running += histogram[b * num_partitions + p];
    }
  }
  partition_begin[num_partitions] = running;
  Tensor by_partition_t, first_position_t, count_at_first_t;
  int32_t *by_partition, *first_position, *count_at_first;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &by_partition_t, &by_partition));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &first_position_t, &first_position));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, n, &count_at_first_t, &count_at_first));
  std::fill_n(count_at_first, n, 0);
  ParallelFor(ctx, blocks.num_blocks, n / blocks.num_blocks * 8,
              [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) {
                  int64_t* off = &offsets[b * num_partitions];
                  for (int64_t i = blocks.Begin(b); i < blocks.Begin(b + 1); ++i)
                    by_partition[off[partition_of(ids[i])]++] = i;
                }
              });

  // Per partition: the first position of each id, and its count there.
  ParallelFor(
      ctx, num_partitions, n / num_partitions * 40, [&](int64_t p0, int64_t p1) {
        // One map for this worker's partitions, cleared between them.
        int64_t largest = 0;
        for (int64_t p = p0; p < p1; ++p) {
          largest = std::max(largest, partition_begin[p + 1] - partition_begin[p]);
        }
        IdIndexMap<Id> map(largest);
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t begin = partition_begin[p], end = partition_begin[p + 1];
          if (p > p0) map.Clear();
          for (int64_t k = begin; k < end; ++k) {
            const int32_t i = by_partition[k];
            bool inserted;
            // Elements arrive in increasing index order within a
            // partition, so the first insertion is the first occurrence.
            const int32_t first = map.FindOrInsert(ids[i], i, &inserted);
            first_position[i] = first;
            ++count_at_first[first];
          }
        }
      });

  // Number the first occurrences in order of appearance. The partition
  // order is no longer needed: its buffer holds the numbers (fresh
  // buffers cost a page fault per 4 KiB, a large share of this op).
  int32_t* unique_index_at = by_partition;
  int32_t num_unique = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Branch-free: whether an element is a first occurrence is random.
    unique_index_at[i] = num_unique;
    num_unique += first_position[i] == i;
  }
  Tensor *unique_t, *counts_t;
  TF_RETURN_IF_ERROR(allocate(num_unique, &unique_t, &counts_t));
  Id* unique = unique_t->flat<Id>().data();
  int32_t* counts = counts_t->flat<int32_t>().data();
  ParallelFor(ctx, n, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int32_t k = unique_index_at[first_position[i]];
      inverse[i] = k;
      if (first_position[i] == i) {
        unique[k] = ids[i];
        counts[k] = count_at_first[i];
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

template <typename Id>
Status functor::UniqueWithCounts<CPUDevice, Id>::operator()(
    OpKernelContext* ctx, const Tensor& ids, Tensor* inverse,
    const AllocateUniqueOutputs& allocate) const {
  const int64_t n = ids.NumElements();
  if (n < kParallelThreshold || NumWorkerThreads(ctx) <= 1) {
    return UniqueSequential(ctx, ids.flat<Id>().data(), n, inverse->flat<int32_t>().data(),
                            allocate);
  }
  return UniqueParallel(ctx, ids.flat<Id>().data(), n, inverse->flat<int32_t>().data(),
                        allocate);
}

#define REGISTER_UNIQUE(DEV, Id)                                                 \
  REGISTER_KERNEL_BUILDER(                                                       \
      Name("TfdeUniqueWithCounts").Device(DEVICE_##DEV).TypeConstraint<Id>("T"), \
      UniqueWithCountsOp<DEV##Device, Id>);
REGISTER_UNIQUE(CPU, int32_t);
REGISTER_UNIQUE(CPU, int64_t);
#if GOOGLE_CUDA
REGISTER_UNIQUE(GPU, int32_t);
REGISTER_UNIQUE(GPU, int64_t);
#endif
#undef REGISTER_UNIQUE

}  // namespace tfde
