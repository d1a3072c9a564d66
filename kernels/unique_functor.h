// The per-device part of TfdeUniqueWithCounts (unique_with_counts_op.cc).
#ifndef TFDE_KERNELS_UNIQUE_FUNCTOR_H_
#define TFDE_KERNELS_UNIQUE_FUNCTOR_H_

#include <functional>

#include "device.h"

namespace tfde {
namespace functor {

// Allocates the op's unique_ids and counts outputs once their size is known.
using AllocateUniqueOutputs =
    std::function<Status(int64_t num_unique, Tensor** unique_ids, Tensor** counts)>;

// Deduplicates `ids` (a vector of fewer than 2^31 - 1): inverse[i] is the
// position of ids[i] among the unique ids, which are in order of first
// appearance and written with their counts to the outputs `allocate` gives.
// Defined for the CPU in unique_with_counts_op.cc, for the GPU in
// cuda/gpu_functors.cc.
#define TFDE_UNIQUE_WITH_COUNTS_SIGNATURE                                      \
  Status operator()(OpKernelContext* ctx, const Tensor& ids, Tensor* inverse, \
                    const AllocateUniqueOutputs& allocate) const
template <typename Device, typename Id>
struct UniqueWithCounts;
template <typename Id>
struct UniqueWithCounts<CPUDevice, Id> {
  TFDE_UNIQUE_WITH_COUNTS_SIGNATURE;
};
#if GOOGLE_CUDA
template <typename Id>
struct UniqueWithCounts<GPUDevice, Id> {
  TFDE_UNIQUE_WITH_COUNTS_SIGNATURE;
};
#endif

}  // namespace functor
}  // namespace tfde

#endif  // TFDE_KERNELS_UNIQUE_FUNCTOR_H_
