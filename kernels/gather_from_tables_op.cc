// The ops over a group of tables exchanged together, addressed by one
// fused row space (table t owns rows [bases[t], bases[t+1])):
// TfdeGatherFromTables, the owner's local gather; TfdeSplitRowsByTable,
// fused rows split by table; TfdeCombineFromTables, the combine reading
// each id's row straight from its table. Gathering straight from every
// table's variable into one output avoids partitioning the requests by
// table and stitching the rows back together (two full copies of the rows).
//
// One op class per op, templated on the device; the CPU functors are below,
// the GPU gather and combine in cuda/gpu_functors.cc (gather_functor.h
// declares them). The row split is a CPU kernel: on a GPU the pipeline
// splits rows with stock ops (tfde.ops.split_rows_by_table).
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <vector>

#include "combine_functor.h"
#include "common.h"
#include "fused_tables.h"
#include "gather_functor.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"

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

REGISTER_OP("TfdeCombineFromTables")
    .Input("tables: num_tables * resource")
    .Input("rows: Tindices")
    .Input("inverse: Tinverse")
    .Input("row_splits: Tsplits")
    .Input("weights: float")
    .Output("output: float")
    .Attr("num_tables: int >= 1")
    .Attr("bases: list(int)")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tsplits: {int32, int64}")
    .Attr("Tinverse: {int32, int64} = DT_INT32")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int num_tables;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &num_tables));
      shape_inference::ShapeHandle splits, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables + 1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables + 2), 1, &splits));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables + 3), 1, &unused));
      shape_inference::DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &batch));
      c->set_output(0, c->Matrix(batch, c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
TfdeEmbeddingCombine reading its rows straight from a group's tables:
rows[k] is a fused row (TfdeGatherFromTables's row space), and output[b]
combines the rows rows[inverse[i]] of sample b's ids. Equal to combining
TfdeGatherFromTables(tables, rows), without writing the gathered rows.
)doc");

// The rows input of the ops over tables: a vector.
inline Status CheckRowsVector(const Tensor& rows) {
  if (rows.dims() != 1) {
    return InvalidArgument("rows must be a vector, got shape ", rows.shape().DebugString());
  }
  return absl::OkStatus();
}

template <typename Device, typename Index>
Status RowOutsideTables(OpKernelContext* ctx, const Tensor& rows, int64_t i) {
  return InvalidArgument("rows[", i, "] = ", functor::ReadElement<Device, Index>()(ctx, rows, i),
                         " is outside every table of the group");
}

// The ops over a group's tables: their num_tables and bases attributes.
class OpOverTables : public OpKernel {
 public:
  explicit OpOverTables(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadFusedTablesAttrs(ctx, &num_tables_, &bases_));
  }

 protected:
  int num_tables_;
  std::vector<int64_t> bases_;
};

template <typename Device, typename Index>
class GatherFromTablesOp : public OpOverTables {
 public:
  explicit GatherFromTablesOp(OpKernelConstruction* ctx) : OpOverTables(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    // Shared locks: concurrent lookups proceed, updates wait.
    FusedTables tables;
    OP_REQUIRES_OK(ctx, tables.Acquire(ctx, bases_));
    const Tensor& rows = ctx->input(num_tables_);
    OP_REQUIRES_OK(ctx, CheckRowsVector(rows));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows.NumElements(), tables.dim()}),
                                             &out));
    int64_t bad;
    OP_REQUIRES_OK(ctx, functor::GatherFromTables<Device, Index>()(ctx, tables, rows, out, &bad));
    OP_REQUIRES(ctx, bad < 0, (RowOutsideTables<Device, Index>(ctx, rows, bad)));
  }
};

template <typename Device, typename Index>
class SplitRowsByTableOp : public OpOverTables {
 public:
  explicit SplitRowsByTableOp(OpKernelConstruction* ctx) : OpOverTables(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckRowsVector(rows));
    int64_t i;
    OP_REQUIRES_OK(ctx, functor::FindOutOfRange<Device, Index>()(
                            ctx, rows, 0, std::numeric_limits<int64_t>::max(), &i));
    OP_REQUIRES(ctx, i < 0,
                InvalidArgument("rows[", i, "] = ",
                                functor::ReadElement<Device, Index>()(ctx, rows, i),
                                " is negative"));
    const int num_tables = num_tables_;
    const auto allocate = [ctx, num_tables](int t, int64_t count, Tensor** local,
                                            Tensor** positions) {
      TF_RETURN_IF_ERROR(ctx->allocate_output(t, TensorShape({count}), local));
      return ctx->allocate_output(num_tables + t, TensorShape({count}), positions);
    };
    OP_REQUIRES_OK(ctx, functor::SplitRowsByTable<Device, Index>()(ctx, bases_, rows, allocate));
  }
};

template <typename Device, typename Index, typename Split>
class CombineFromTablesOp : public OpOverTables {
 public:
  explicit CombineFromTablesOp(OpKernelConstruction* ctx) : OpOverTables(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiner(ctx, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(num_tables_);
    const Tensor& inverse = ctx->input(num_tables_ + 1);
    const Tensor& splits = ctx->input(num_tables_ + 2);
    const Tensor& weights = ctx->input(num_tables_ + 3);
    OP_REQUIRES_OK(ctx, CheckRowsVector(rows));
    // Shared locks: concurrent lookups proceed, updates wait.
    FusedTables tables;
    OP_REQUIRES_OK(ctx, tables.Acquire(ctx, bases_));
    OP_REQUIRES_OK(ctx, CheckRaggedInputs(inverse, splits, weights));
    Coefficients coefficients;
    coefficients.combine_only = true;
    OP_REQUIRES_OK(ctx, PrepareCoefficients<Device, Split>(ctx, inverse, splits, weights,
                                                           rows.NumElements(), combiner_,
                                                           &coefficients));
    const int64_t batch = splits.NumElements() - 1;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, tables.dim()}), &out));
    int64_t bad;
    OP_REQUIRES_OK(ctx, functor::CombineFromTables<Device, Index, Split>()(
                            ctx, tables, rows, splits, coefficients, out, &bad));
    OP_REQUIRES(ctx, bad < 0, (RowOutsideTables<Device, Index>(ctx, rows, bad)));
  }

 private:
  Combiner combiner_;
};

// ---- CPU functors

namespace {

// Resolves every fused row to its table, in parallel, with `store(k, t)`;
// returns the first row no table holds, or -1.
template <typename Index, typename Store>
int64_t ResolveRows(OpKernelContext* ctx, const FusedTables& tables, const Index* rows,
                    int64_t m, const Store& store) {
  std::atomic<int64_t> first_bad{m};
  ParallelFor(ctx, m, 8, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int t = tables.TableOf(rows[k]);
      if (t >= 0) {
        store(k, t);
        continue;
      }
      int64_t seen = first_bad.load();
      while (k < seen && !first_bad.compare_exchange_weak(seen, k)) {
      }
      return;
    }
  });
  const int64_t bad = first_bad.load();
  return bad < m ? bad : -1;
}

}  // namespace

template <typename Index>
Status functor::GatherFromTables<CPUDevice, Index>::operator()(OpKernelContext* ctx,
                                                               const FusedTables& tables,
                                                               const Tensor& rows_t,
                                                               Tensor* out_t,
                                                               int64_t* bad_row) const {
  const int64_t m = rows_t.NumElements();
  const int64_t dim = tables.dim();
  const Index* rows = rows_t.flat<Index>().data();
  // Every row resolved to its table first: all errors are raised before any
  // output is written.
  Tensor table_of_t;
  int32_t* table_of;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, m, &table_of_t, &table_of));
  *bad_row = ResolveRows(ctx, tables, rows, m, [&](int64_t k, int t) { table_of[k] = t; });
  if (*bad_row >= 0) return absl::OkStatus();
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
  return absl::OkStatus();
}

template <typename Index>
Status functor::SplitRowsByTable<CPUDevice, Index>::operator()(
    OpKernelContext* ctx, const std::vector<int64_t>& bases, const Tensor& rows_t,
    const AllocateSplitOutputs& allocate) const {
  const int num_tables = static_cast<int>(bases.size());
  const int64_t m = rows_t.NumElements();
  const Index* rows = rows_t.flat<Index>().data();
  Tensor table_of_t;
  int32_t* table_of;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, m, &table_of_t, &table_of));
  std::vector<int64_t> count(num_tables, 0);
  for (int64_t i = 0; i < m; ++i) {
    int t = 0;
    while (t + 1 < num_tables && rows[i] >= bases[t + 1]) ++t;
    table_of[i] = t;
    ++count[t];
  }
  std::vector<Index*> local(num_tables);
  std::vector<int32_t*> positions(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    Tensor *local_t, *positions_t;
    TF_RETURN_IF_ERROR(allocate(t, count[t], &local_t, &positions_t));
    local[t] = local_t->flat<Index>().data();
    positions[t] = positions_t->flat<int32_t>().data();
  }
  for (int64_t i = 0; i < m; ++i) {
    const int t = table_of[i];
    *local[t]++ = static_cast<Index>(rows[i] - bases[t]);
    *positions[t]++ = static_cast<int32_t>(i);
  }
  return absl::OkStatus();
}

template <typename Index, typename Split>
Status functor::CombineFromTables<CPUDevice, Index, Split>::operator()(
    OpKernelContext* ctx, const FusedTables& tables, const Tensor& rows_t,
    const Tensor& splits_t, const Coefficients& c, Tensor* out_t, int64_t* bad_row) const {
  const Index* rows = rows_t.flat<Index>().data();
  const int64_t m = rows_t.NumElements();
  const int64_t dim = tables.dim();
  if (tables.num_tables() == 1) {
    // One table (a feature read from its own): its rows are range-checked
    // as any index input is, and each id's row is found as it is read,
    // where several tables need a row's table resolved first.
    TF_RETURN_IF_ERROR(
        functor::FindOutOfRange<CPUDevice, Index>()(ctx, rows_t, 0, tables.end(), bad_row));
    if (*bad_row >= 0) return absl::OkStatus();
    const float* data = tables.data(0);
    CombineRows<float, Split>(ctx, splits_t, c, dim,
                              [data, rows, dim](int32_t k) { return data + rows[k] * dim; },
                              out_t->flat<float>().data());
    return absl::OkStatus();
  }
  // Every row resolved to its table's memory first: all of `rows` must lie
  // in the group's tables, as for TfdeGatherFromTables, and the first that
  // does not is an error before any output is written.
  Tensor row_data_t;
  uint64_t* row_addresses;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, m, &row_data_t, &row_addresses));
  const float** row_data = reinterpret_cast<const float**>(row_addresses);
  *bad_row = ResolveRows(ctx, tables, rows, m,
                         [&](int64_t k, int t) { row_data[k] = tables.Row(t, rows[k]); });
  if (*bad_row >= 0) return absl::OkStatus();
  CombineRows<float, Split>(ctx, splits_t, c, dim, [row_data](int32_t k) { return row_data[k]; },
                            out_t->flat<float>().data());
  return absl::OkStatus();
}

// ---- registration

#define REGISTER_GATHER(DEV, Index)                                  \
  REGISTER_KERNEL_BUILDER(Name("TfdeGatherFromTables")               \
                              .Device(DEVICE_##DEV)                  \
                              .TypeConstraint<Index>("Tindices"),    \
                          GatherFromTablesOp<DEV##Device, Index>);
REGISTER_GATHER(CPU, int32_t);
REGISTER_GATHER(CPU, int64_t);
#if GOOGLE_CUDA
REGISTER_GATHER(GPU, int32_t);
REGISTER_GATHER(GPU, int64_t);
#endif
#undef REGISTER_GATHER

#define REGISTER_SPLIT(Index)                                      \
  REGISTER_KERNEL_BUILDER(Name("TfdeSplitRowsByTable")             \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<Index>("Tindices"),  \
                          SplitRowsByTableOp<CPUDevice, Index>);
REGISTER_SPLIT(int32_t);
REGISTER_SPLIT(int64_t);
#undef REGISTER_SPLIT

#define REGISTER_COMBINE_FROM_TABLES(DEV, Index, Split, ...)            \
  REGISTER_KERNEL_BUILDER(Name("TfdeCombineFromTables")                 \
                              .Device(DEVICE_##DEV)                     \
                              .TypeConstraint<Index>("Tindices")        \
                              .TypeConstraint<Split>("Tsplits") __VA_ARGS__, \
                          CombineFromTablesOp<DEV##Device, Index, Split>);
#define REGISTER_COMBINE_FROM_TABLES_ALL(DEV, ...)                  \
  REGISTER_COMBINE_FROM_TABLES(DEV, int32_t, int32_t, __VA_ARGS__)  \
  REGISTER_COMBINE_FROM_TABLES(DEV, int32_t, int64_t, __VA_ARGS__)  \
  REGISTER_COMBINE_FROM_TABLES(DEV, int64_t, int32_t, __VA_ARGS__)  \
  REGISTER_COMBINE_FROM_TABLES(DEV, int64_t, int64_t, __VA_ARGS__)
REGISTER_COMBINE_FROM_TABLES_ALL(CPU, )
#if GOOGLE_CUDA
// The GPU combine kernels read an int32 inverse (as TfdeEmbeddingCombine's).
REGISTER_COMBINE_FROM_TABLES_ALL(GPU, .TypeConstraint<int32_t>("Tinverse"))
#endif
#undef REGISTER_COMBINE_FROM_TABLES_ALL
#undef REGISTER_COMBINE_FROM_TABLES

}  // namespace tfde
