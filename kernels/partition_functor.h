// The per-device part of TfdePartitionByShard (partition_by_shard_op.cc).
#ifndef TFDE_KERNELS_PARTITION_FUNCTOR_H_
#define TFDE_KERNELS_PARTITION_FUNCTOR_H_

#include "device.h"

namespace tfde {
namespace functor {

// Groups `ids` by shard (floor modulo num_shards), stable inside a shard:
// local_ids holds id // num_shards (the id itself when `dynamic`),
// positions[i] where ids[i] went, shard_counts[s] the size of shard s.
// Static ids were checked to be non-negative. Defined for the CPU in
// partition_by_shard_op.cc, for the GPU in cuda/gpu_functors.cc.
#define TFDE_PARTITION_BY_SHARD_SIGNATURE                                      \
  Status operator()(OpKernelContext* ctx, const Tensor& ids, int32_t num_shards, \
                    bool dynamic, Tensor* local_ids, Tensor* shard_counts,     \
                    Tensor* positions) const
template <typename Device, typename Id>
struct PartitionByShard;
template <typename Id>
struct PartitionByShard<CPUDevice, Id> {
  TFDE_PARTITION_BY_SHARD_SIGNATURE;
};
#if GOOGLE_CUDA
template <typename Id>
struct PartitionByShard<GPUDevice, Id> {
  TFDE_PARTITION_BY_SHARD_SIGNATURE;
};
#endif

}  // namespace functor
}  // namespace tfde

#endif  // TFDE_KERNELS_PARTITION_FUNCTOR_H_
