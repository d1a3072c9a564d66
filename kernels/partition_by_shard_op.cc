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

template <typename Id>
Status functor::PartitionByShard<CPUDevice, Id>::operator()(
    OpKernelContext* ctx, const Tensor& ids_t, int32_t num_shards, bool dynamic,
    Tensor* local_t, Tensor* counts_t, Tensor* positions_t) const {
  const int64_t n = ids_t.NumElements();
  const Id* ids = ids_t.flat<Id>().data();
  Id* local = local_t->flat<Id>().data();
  int32_t* counts = counts_t->flat<int32_t>().data();
  int32_t* positions = positions_t->flat<int32_t>().data();
  const Id n_shards = static_cast<Id>(num_shards);
  auto shard_of = [n_shards](Id id) -> int64_t {
    Id r = id % n_shards;
    return r < 0 ? r + n_shards : r;  // floor modulo for dynamic keys
  };

  // Stable counting sort in blocks: per-block histograms, exclusive
  // offsets in (shard, block) order, then a scatter per block.
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
                    local[dest] = dynamic ? id : id / n_shards;
                    positions[i] = static_cast<int32_t>(dest);
                  }
                }
              });
  return absl::OkStatus();
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
