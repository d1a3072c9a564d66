// A group's tables as one fused row space (tables of one width looked up
// together): table t owns fused rows [bases[t], bases[t+1]).
#ifndef TFDE_KERNELS_FUSED_TABLES_H_
#define TFDE_KERNELS_FUSED_TABLES_H_

#include <algorithm>
#include <vector>

#include "common.h"
#include "variables.h"

namespace tfde {

// Reads the num_tables and bases attributes of an op over a group's tables
// and checks them: bases starts at 0 and increases.
inline Status ReadFusedTablesAttrs(OpKernelConstruction* ctx, int* num_tables,
                                   std::vector<int64_t>* bases) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_tables", num_tables));
  TF_RETURN_IF_ERROR(ctx->GetAttr("bases", bases));
  if (static_cast<int>(bases->size()) != *num_tables) {
    return InvalidArgument("bases has ", bases->size(), " entries for ", *num_tables,
                           " tables");
  }
  for (int t = 0; t < *num_tables; ++t) {
    if (t == 0 ? (*bases)[0] != 0 : (*bases)[t] <= (*bases)[t - 1]) {
      return InvalidArgument("bases must start at 0 and increase, got bases[", t,
                             "] = ", (*bases)[t]);
    }
  }
  return absl::OkStatus();
}

// A group's tables as one fused row space, locked for reading: resolves a
// fused row to its table's row, checking that some table holds it. The
// tables' memory is on the op's device (host pointers on the CPU).
class FusedTables {
 public:
  // Locks inputs [0, num_tables) shared and checks widths and ranges.
  Status Acquire(OpKernelContext* ctx, const std::vector<int64_t>& bases) {
    const int num_tables = static_cast<int>(bases.size());
    bases_ = bases;
    TF_RETURN_IF_ERROR(vars_.Acquire(ctx, 0, num_tables, LockMode::kShared));
    dim_ = vars_.dim(0);
    data_.resize(num_tables);
    num_rows_.resize(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      if (vars_.dim(t) != dim_) {
        return InvalidArgument("table ", t, " has width ", vars_.dim(t),
                               " but table 0 has width ", dim_);
      }
      const int64_t next = t + 1 < num_tables ? bases_[t + 1] : -1;
      if (next >= 0 && vars_.num_rows(t) < next - bases_[t]) {
        return InvalidArgument("table ", t, " has ", vars_.num_rows(t),
                               " rows but its range needs ", next - bases_[t]);
      }
      data_[t] = vars_.tensor(t).flat<float>().data();
      num_rows_[t] = vars_.num_rows(t);
    }
    return absl::OkStatus();
  }

  // The table holding fused row r, or -1 if none does.
  int TableOf(int64_t r) const {
    const int num_tables = static_cast<int>(bases_.size());
    int t = 0;
    if (num_tables <= 8) {
      // Groups hold a few tables: a scan beats a binary search.
      while (t + 1 < num_tables && r >= bases_[t + 1]) ++t;
    } else {
      t = static_cast<int>(std::upper_bound(bases_.begin(), bases_.end(), r) -
                           bases_.begin()) - 1;
    }
    return r >= 0 && t >= 0 && r - bases_[t] < num_rows_[t] ? t : -1;
  }
  const float* Row(int t, int64_t r) const { return data_[t] + (r - bases_[t]) * dim_; }
  int64_t dim() const { return dim_; }
  int num_tables() const { return static_cast<int>(bases_.size()); }
  int64_t base(int t) const { return bases_[t]; }
  const float* data(int t) const { return data_[t]; }
  // Every table's data and base, in table order.
  const float* const* all_data() const { return data_.data(); }
  const int64_t* all_bases() const { return bases_.data(); }
  // The first fused row past the last table.
  int64_t end() const { return bases_.back() + num_rows_.back(); }

 private:
  LockedVariables vars_;
  std::vector<int64_t> bases_;
  std::vector<const float*> data_;
  std::vector<int64_t> num_rows_;
  int64_t dim_ = 0;
};

}  // namespace tfde

#endif  // TFDE_KERNELS_FUSED_TABLES_H_
