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
    Tensor table_of_t;
    int32_t* table_of;
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, m, &table_of_t, &table_of));
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

REGISTER_OP("TfdeSplitRowsByTable")
    .Input("rows: Tindices")
    .Output("local_rows: num_tables * Tindices")
    .Output("positions: num_tables * int32")
    .Attr("num_tables: int >= 1")
    .Attr("bases: list(int)")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int num_tables;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &num_tables));
      shape_inference::ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &rows));
      for (int i = 0; i < 2 * num_tables; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Splits fused rows by the table that owns them (table t from bases[t]):
local_rows[t] holds rows[i] - bases[t] for each row of table t, in order,
and positions[t] the i they came from. Rows must be >= 0; whether a row is
inside its table is for whoever reads it (the table's size is not an input).
)doc");

template <typename Index>
class SplitRowsByTableOp : public OpKernel {
 public:
  explicit SplitRowsByTableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadFusedTablesAttrs(ctx, &num_tables_, &bases_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(0);
    OP_REQUIRES(ctx, rows_t.dims() == 1,
                InvalidArgument("rows must be a vector, got shape ",
                                rows_t.shape().DebugString()));
    const int64_t m = rows_t.NumElements();
    const Index* rows = rows_t.flat<Index>().data();
    Tensor table_of_t;
    int32_t* table_of;
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, m, &table_of_t, &table_of));
    std::vector<int64_t> count(num_tables_, 0);
    for (int64_t i = 0; i < m; ++i) {
      OP_REQUIRES(ctx, rows[i] >= 0,
                  InvalidArgument("rows[", i, "] = ", rows[i], " is negative"));
      int t = 0;
      while (t + 1 < num_tables_ && rows[i] >= bases_[t + 1]) ++t;
      table_of[i] = t;
      ++count[t];
    }
    std::vector<Index*> local(num_tables_);
    std::vector<int32_t*> positions(num_tables_);
    for (int t = 0; t < num_tables_; ++t) {
      Tensor* local_t = nullptr;
      Tensor* positions_t = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, TensorShape({count[t]}), &local_t));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(num_tables_ + t, TensorShape({count[t]}),
                                               &positions_t));
      local[t] = local_t->flat<Index>().data();
      positions[t] = positions_t->flat<int32_t>().data();
    }
    for (int64_t i = 0; i < m; ++i) {
      const int t = table_of[i];
      *local[t]++ = static_cast<Index>(rows[i] - bases_[t]);
      *positions[t]++ = static_cast<int32_t>(i);
    }
  }

 private:
  int num_tables_;
  std::vector<int64_t> bases_;
};

#define REGISTER_SPLIT(Index)                                      \
  REGISTER_KERNEL_BUILDER(Name("TfdeSplitRowsByTable")             \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<Index>("Tindices"),  \
                          SplitRowsByTableOp<Index>);
REGISTER_SPLIT(int32_t);
REGISTER_SPLIT(int64_t);
#undef REGISTER_SPLIT

#define REGISTER_GATHER(Index)                                     \
  REGISTER_KERNEL_BUILDER(Name("TfdeGatherFromTables")             \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<Index>("Tindices"),  \
                          GatherFromTablesOp<Index>);
REGISTER_GATHER(int32_t);
REGISTER_GATHER(int64_t);
#undef REGISTER_GATHER

}  // namespace tfde
