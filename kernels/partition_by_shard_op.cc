// TfdePartitionByShard: groups ids by owning shard (id % N) for the
// all-to-all, keeping their relative order inside each shard.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <limits>
#include <vector>

#include "common.h"
#include "input_checks.h"
#include "partition_functor.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfde {

REGISTER_OP("TfdePartitionByShard")
    .Input("ids: T")
    .Input("num_shards: Tnum_shards")
    .Output("local_ids: T")
    .Output("shard_counts: int32")
    .Output("positions: int32")
    .Attr("T: {int32, int64}")
    .Attr("Tnum_shards: {int32, int64} = DT_INT32")
    .Attr("dynamic: bool = false")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle ids, num_shards;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &num_shards));
      c->set_output(0, ids);
      shape_inference::DimensionHandle n_shards;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(1, &n_shards));
      c->set_output(1, c->Vector(n_shards));
      c->set_output(2, ids);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Groups ids by shard `id % num_shards`, stable inside a shard.

local_ids: the ids grouped by shard; each is `id // num_shards`, its row in
  the owner's shard (static tables), or the id itself when `dynamic`.
shard_counts: how many ids go to each shard.
positions: positions[i] is where ids[i] sits in local_ids, the permutation
  that undoes the grouping (gather(grouped_result, positions)).
dynamic: ids are keys of a hash table, not rows: negative ids are allowed and
  are routed by floor modulo. Static tables reject negative ids.
)doc");

template <typename Device, typename Id>
class PartitionByShardOp : public OpKernel {
 public:
  explicit PartitionByShardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dynamic", &dynamic_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckIdVector(ids_t));
    int32_t num_shards;
    OP_REQUIRES_OK(ctx, ReadNumShards(ctx->input(1), &num_shards));
    if (!dynamic_) {
      int64_t i;
      OP_REQUIRES_OK(ctx, functor::FindOutOfRange<Device, Id>()(
                              ctx, ids_t, 0, std::numeric_limits<int64_t>::max(), &i));
      OP_REQUIRES(ctx, i < 0,
                  InvalidArgument("ids[", i, "] = ",
                                  functor::ReadElement<Device, Id>()(ctx, ids_t, i),
                                  " is negative; a static table has rows "
                                  "0..vocabulary_size-1"));
    }
    Tensor *local_t, *counts_t, *positions_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids_t.shape(), &local_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_shards}), &counts_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ids_t.shape(), &positions_t));
    OP_REQUIRES_OK(ctx, functor::PartitionByShard<Device, Id>()(
                            ctx, ids_t, num_shards, dynamic_, local_t, counts_t, positions_t));
  }

 private:
  bool dynamic_;
};

namespace {

// The stable counting sort of PartitionByShard's CPU functor, for one way
// of computing an id's shard and local id.
template <typename Id, typename ShardOf, typename LocalOf>
Status PartitionInBlocks(OpKernelContext* ctx, const Id* ids, int64_t n,
                         int32_t num_shards, ShardOf shard_of, LocalOf local_of,
                         Id* local, int32_t* counts, int32_t* positions) {
  // Per-block histograms, exclusive offsets in (shard, block) order, then
  // a scatter per block.
  const int64_t num_blocks =
      std::max<int64_t>(1, std::min<int64_t>(4 * NumWorkerThreads(ctx),
                                             n / 4096));
  const Blocks blocks{n, num_blocks};
  // Scratch from the context: num_shards is an input, and a count no
  // memory can hold must be an error, not an exception.
  Tensor histogram_t, offsets_t;
  int64_t *histogram, *offsets;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, num_blocks * num_shards, &histogram_t,
                                      &histogram));
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, num_blocks * num_shards, &offsets_t, &offsets));
  std::fill_n(histogram, num_blocks * num_shards, 0);
  ParallelFor(ctx, num_blocks, std::max<int64_t>(1, n / num_blocks) * 6,
              [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) {
                  int64_t* h = &histogram[b * num_shards];
                  for (int64_t i = blocks.Begin(b); i < blocks.Begin(b + 1); ++i)
                    ++h[shard_of(ids[i])];
                }
              });
  int64_t running = 0;
  for (int32_t s = 0; s < num_shards; ++s) {
    const int64_t shard_begin = running;
    for (int64_t b = 0; b < num_blocks; ++b) {
      offsets[b * num_shards + s] = running;
      running += histogram[b * num_shards + s];
    }
    counts[s] = static_cast<int32_t>(running - shard_begin);
  }
  ParallelFor(ctx, num_blocks, std::max<int64_t>(1, n / num_blocks) * 10,
              [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) {
                  int64_t* off = &offsets[b * num_shards];
                  for (int64_t i = blocks.Begin(b); i < blocks.Begin(b + 1); ++i) {
                    const Id id = ids[i];
                    const int64_t dest = off[shard_of(id)]++;
                    local[dest] = local_of(id);
                    positions[i] = static_cast<int32_t>(dest);
                  }
                }
              });
  return absl::OkStatus();
}

}  // namespace

template <typename Id>
Status functor::PartitionByShard<CPUDevice, Id>::operator()(
    OpKernelContext* ctx, const Tensor& ids_t, int32_t num_shards, bool dynamic,
    Tensor* local_t, Tensor* counts_t, Tensor* positions_t) const {
  const int64_t n = ids_t.NumElements();
  const Id* ids = ids_t.flat<Id>().data();
  Id* local = local_t->flat<Id>().data();
  int32_t* counts = counts_t->flat<int32_t>().data();
  int32_t* positions = positions_t->flat<int32_t>().data();
  auto keep = [](Id id) { return id; };
  if ((num_shards & (num_shards - 1)) == 0) {
    // A power of two, as replica counts mostly are: a mask and a shift for
    // the two divisions per id, which were most of the partition of every
    // id of a batch (the pooled exchange's). In two's complement the mask
    // is the floor modulo of negative keys too; static ids are not
    // negative (checked), so the shift is their quotient.
    const Id mask = static_cast<Id>(num_shards - 1);
    const int shift = __builtin_ctz(static_cast<uint32_t>(num_shards));
    auto shard_of = [mask](Id id) -> int64_t { return id & mask; };
    if (dynamic)
      return PartitionInBlocks(ctx, ids, n, num_shards, shard_of, keep, local, counts,
                               positions);
    return PartitionInBlocks(ctx, ids, n, num_shards, shard_of,
                             [shift](Id id) { return static_cast<Id>(id >> shift); },
                             local, counts, positions);
  }
  const Id n_shards = static_cast<Id>(num_shards);
  auto shard_of = [n_shards](Id id) -> int64_t {
    Id r = id % n_shards;
    return r < 0 ? r + n_shards : r;  // floor modulo for dynamic keys
  };
  if (dynamic)
    return PartitionInBlocks(ctx, ids, n, num_shards, shard_of, keep, local, counts,
                             positions);
  return PartitionInBlocks(ctx, ids, n, num_shards, shard_of,
                           [n_shards](Id id) { return static_cast<Id>(id / n_shards); },
                           local, counts, positions);
}

// num_shards is read on the host.
#define REGISTER_PARTITION(DEV, Id)                                          \
  REGISTER_KERNEL_BUILDER(Name("TfdePartitionByShard")                       \
                              .Device(DEVICE_##DEV)                          \
                              .HostMemory("num_shards")                      \
                              .TypeConstraint<Id>("T"),                      \
                          PartitionByShardOp<DEV##Device, Id>);
REGISTER_PARTITION(CPU, int32_t);
REGISTER_PARTITION(CPU, int64_t);
#if GOOGLE_CUDA
REGISTER_PARTITION(GPU, int32_t);
REGISTER_PARTITION(GPU, int64_t);
#endif
#undef REGISTER_PARTITION

}  // namespace tfde
