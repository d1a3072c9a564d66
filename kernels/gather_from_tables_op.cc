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
#include "fused_tables.h"

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
    OP_REQUIRES_OK(ctx, ReadFusedTablesAttrs(ctx, &num_tables_, &bases_));
  }

  void Compute(OpKernelContext* ctx) override {
    // Shared locks: concurrent lookups proceed, updates wait.
    FusedTables tables;
    OP_REQUIRES_OK(ctx, tables.Acquire(ctx, bases_));
    const int64_t dim = tables.dim();
    const Tensor& rows_t = ctx->input(num_tables_);
    OP_REQUIRES(ctx, rows_t.dims() == 1,
                InvalidArgument("rows must be a vector, got shape ",
                                rows_t.shape().DebugString()));
    const int64_t m = rows_t.NumElements();
    const Index* rows = rows_t.flat<Index>().data();
    // Resolve every row to its table first: all errors are raised before
    // any output is written.
    std::vector<int32_t> table_of(m);
    for (int64_t i = 0; i < m; ++i) {
      table_of[i] = tables.TableOf(rows[i]);
      OP_REQUIRES(ctx, table_of[i] >= 0,
                  InvalidArgument("rows[", i, "] = ", rows[i],
                                  " is outside every table of the group"));
    }
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, dim}), &out_t));
    float* out = out_t->flat<float>().data();
    ParallelFor(ctx, m, dim * 2, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        if (i + kPrefetchDistance < i1) {
          const int64_t a = i + kPrefetchDistance;
          PrefetchRow(tables.Row(table_of[a], rows[a]), dim * sizeof(float), false);
        }
        std::copy_n(tables.Row(table_of[i], rows[i]), dim, out + i * dim);
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
