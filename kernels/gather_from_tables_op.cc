// TfdeGatherFromTables: the owner's local gather for a group of tables
// exchanged together.
//
// The group's tables are addressed by one fused row space: table t owns
// rows [bases[t], bases[t+1]). Gathering straight from every table's
// variable into one output avoids partitioning the requests by table and
// stitching the rows back together (two full copies of the rows).

#include <algorithm>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "variables.h"

namespace tfde {

REGISTER_OP("TfdeGatherFromTables")
    .Input("tables: num_tables * resource")
    .Input("rows: Tindices")
    .Output("output: float")
    .Attr("num_tables: int >= 1")
    .Attr("bases: list(int)")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int num_tables;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &num_tables));
      shape_inference::ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables), 1, &rows));
      c->set_output(0, c->Matrix(c->Dim(rows, 0), c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
output[i] = tables[t][rows[i] - bases[t]] where t is the table whose range
[bases[t], bases[t+1]) holds rows[i]. All tables are float32 matrices of one
width; bases is increasing and starts at 0.
)doc");

template <typename Index>
class GatherFromTablesOp : public OpKernel {
 public:
  explicit GatherFromTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bases", &bases_));
    OP_REQUIRES(ctx, static_cast<int>(bases_.size()) == num_tables_,
                InvalidArgument("bases has ", bases_.size(),
                                " entries for ", num_tables_, " tables"));
    for (int t = 0; t < num_tables_; ++t) {
      OP_REQUIRES(ctx, t == 0 ? bases_[0] == 0 : bases_[t] > bases_[t - 1],
                  InvalidArgument("bases must start at 0 and increase, got ",
                                  "bases[", t, "] = ", bases_[t]));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    // Shared locks: concurrent lookups proceed, updates wait.
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Acquire(ctx, 0, num_tables_, LockMode::kShared));
    const int64_t dim = vars.dim(0);
    std::vector<const float*> data(num_tables_);
    std::vector<int64_t> num_rows(num_tables_);
    for (int t = 0; t < num_tables_; ++t) {
      OP_REQUIRES(ctx, vars.dim(t) == dim,
                  InvalidArgument("table ", t, " has width ", vars.dim(t),
                                  " but table 0 has width ", dim));
      const int64_t next = t + 1 < num_tables_ ? bases_[t + 1] : -1;
      OP_REQUIRES(ctx, next < 0 || vars.num_rows(t) >= next - bases_[t],
                  InvalidArgument("table ", t, " has ", vars.num_rows(t),
                                  " rows but its range needs ", next - bases_[t]));
      data[t] = vars.tensor(t).flat<float>().data();
      num_rows[t] = vars.num_rows(t);
    }

    const Tensor& rows_t = ctx->input(num_tables_);
    OP_REQUIRES(ctx, rows_t.dims() == 1,
                InvalidArgument("rows must be a vector, got shape ",
                                rows_t.shape().DebugString()));
    const int64_t m = rows_t.NumElements();
    const Index* rows = rows_t.flat<Index>().data();
    // Resolve every row to (table, local row) first: all errors are raised
    // before any output is written.
    std::vector<int32_t> table_of(m);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t r = rows[i];
      const int t = static_cast<int>(
          std::upper_bound(bases_.begin(), bases_.end(), r) - bases_.begin()) - 1;
      OP_REQUIRES(ctx, r >= 0 && t >= 0 && r - bases_[t] < num_rows[t],
                  InvalidArgument("rows[", i, "] = ", r,
                                  " is outside every table of the group"));
      table_of[i] = t;
    }
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, dim}), &out_t));
    float* out = out_t->flat<float>().data();
    ParallelFor(ctx, m, dim * 2, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        if (i + kPrefetchDistance < i1) {
          const int64_t a = i + kPrefetchDistance;
          const int ta = table_of[a];
          PrefetchRow(data[ta] + (static_cast<int64_t>(rows[a]) - bases_[ta]) * dim,
                      dim * sizeof(float), false);
        }
        const int t = table_of[i];
        const float* src = data[t] + (static_cast<int64_t>(rows[i]) - bases_[t]) * dim;
        std::copy_n(src, dim, out + i * dim);
      }
    });
  }

 private:
  int num_tables_;
  std::vector<int64_t> bases_;
};

#define REGISTER_GATHER(Index)                                     \
  REGISTER_KERNEL_BUILDER(Name("TfdeGatherFromTables")             \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<Index>("Tindices"),  \
                          GatherFromTablesOp<Index>);
REGISTER_GATHER(int32_t);
REGISTER_GATHER(int64_t);
#undef REGISTER_GATHER

}  // namespace tfde
