// The per-device parts of the ops over a group's tables
// (gather_from_tables_op.cc): TfdeGatherFromTables, TfdeSplitRowsByTable and
// TfdeCombineFromTables.
#ifndef TFDE_KERNELS_GATHER_FUNCTOR_H_
#define TFDE_KERNELS_GATHER_FUNCTOR_H_

#include <functional>

#include "combine_functor.h"
#include "device.h"
#include "fused_tables.h"

namespace tfde {
namespace functor {

// out[i] = the fused row rows[i] of `tables`; *bad_row is the first i whose
// row no table holds (then nothing is written), or -1.
#define TFDE_GATHER_FROM_TABLES_SIGNATURE                                          \
  Status operator()(OpKernelContext* ctx, const FusedTables& tables, const Tensor& rows, \
                    Tensor* out, int64_t* bad_row) const
template <typename Device, typename Index>
struct GatherFromTables;
template <typename Index>
struct GatherFromTables<CPUDevice, Index> {
  TFDE_GATHER_FROM_TABLES_SIGNATURE;
};
#if GOOGLE_CUDA
template <typename Index>
struct GatherFromTables<GPUDevice, Index> {
  TFDE_GATHER_FROM_TABLES_SIGNATURE;
};
#endif

// Allocates table t's two outputs once its row count is known.
using AllocateSplitOutputs =
    std::function<Status(int t, int64_t count, Tensor** local_rows, Tensor** positions)>;

// Splits non-negative fused rows by the table owning them (table t from
// bases[t]). CPU only.
template <typename Device, typename Index>
struct SplitRowsByTable;
template <typename Index>
struct SplitRowsByTable<CPUDevice, Index> {
  Status operator()(OpKernelContext* ctx, const std::vector<int64_t>& bases, const Tensor& rows,
                    const AllocateSplitOutputs& allocate) const;
};

// EmbeddingCombine of GatherFromTables(tables, rows) without the gathered
// rows: *bad_row as for GatherFromTables.
#define TFDE_COMBINE_FROM_TABLES_SIGNATURE                                             \
  Status operator()(OpKernelContext* ctx, const FusedTables& tables, const Tensor& rows, \
                    const Tensor& splits, const Coefficients& c, Tensor* out,          \
                    int64_t* bad_row) const
template <typename Device, typename Index, typename Split>
struct CombineFromTables;
template <typename Index, typename Split>
struct CombineFromTables<CPUDevice, Index, Split> {
  TFDE_COMBINE_FROM_TABLES_SIGNATURE;
};
#if GOOGLE_CUDA
template <typename Index, typename Split>
struct CombineFromTables<GPUDevice, Index, Split> {
  TFDE_COMBINE_FROM_TABLES_SIGNATURE;
};
#endif

}  // namespace functor
}  // namespace tfde

#endif  // TFDE_KERNELS_GATHER_FUNCTOR_H_
