// The ops that move a dynamic embedding table's whole state (dynamic_table.h)
// or keep it in bounds: export (whole, or the rows seen since a step),
// import, eviction and stats. The step's ops: dynamic_table_ops.cc.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <limits>
#include <vector>

#include "common.h"
#include "device.h"
#include "dynamic_table.h"
#include "input_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/platform/mutex.h"

namespace tfde {

using ::tensorflow::DT_INT64;
using ::tensorflow::mutex_lock;
using ::tensorflow::tf_shared_lock;
using ::tensorflow::core::RefCountPtr;

REGISTER_OP("TfdeDynamicTableExport")
    .Input("table: resource")
    .Input("seen_after: int64")
    .Output("ids: int64")
    .Output("values: float")
    .Output("counts: int64")
    .Output("last_seen: int64")
    .Output("pending_ids: int64")
    .Output("pending_counts: int64")
    .Output("pending_last_seen: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->UnknownShapeOfRank(3));
      for (int i = 2; i < 7; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The rows last seen after step `seen_after` (every row: the lowest int64),
sorted by id: values[k] is [slots, dim] (the embedding, then the optimizer
slots), with its sighting count and the step it was last seen; and the ids
seen but not admitted yet, with their counts and steps, whole (they are
few and carry no rows). A delta's export asks for the rows seen since the
previous save, so that its time follows the rows changed.
)doc");

class DynamicTableExportOp : public OpKernel {
 public:
  explicit DynamicTableExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& step = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step.shape()),
                InvalidArgument("seen_after must be a scalar step, got shape ",
                                step.shape().DebugString()));
    const int64_t seen_after = step.scalar<int64_t>()();
    RefCountPtr<DynamicEmbeddingTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    tf_shared_lock lock(*table->mu());
    const TableSpec& spec = table->spec();
    const auto rows = table->SortedRows(seen_after);
    const int64_t k = static_cast<int64_t>(rows.size());
    const int64_t width = spec.dim * spec.num_slots;
    Tensor *ids_t, *values_t, *counts_t, *last_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &ids_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({k, spec.num_slots, spec.dim}), &values_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({k}), &counts_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({k}), &last_t));
    float* values = values_t->flat<float>().data();
    RowStore& store = table->store();
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = rows[j].second;
      ids_t->flat<int64_t>()(j) = rows[j].first;
      counts_t->flat<int64_t>()(j) = store.Count(row);
      last_t->flat<int64_t>()(j) = store.LastSeen(row);
    }
    ParallelFor(ctx, k, width, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        std::copy_n(table->Values(rows[j].second), width, values + j * width);
      }
    });
    const auto pending = table->SortedPending();
    const int64_t p = static_cast<int64_t>(pending.size());
    Tensor *pid_t, *pcount_t, *plast_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({p}), &pid_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({p}), &pcount_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({p}), &plast_t));
    for (int64_t j = 0; j < p; ++j) {
      pid_t->flat<int64_t>()(j) = pending[j].first;
      pcount_t->flat<int64_t>()(j) = pending[j].second.count;
      plast_t->flat<int64_t>()(j) = pending[j].second.last_seen;
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdeDynamicTableExport").Device(DEVICE_CPU),
                        DynamicTableExportOp);

REGISTER_OP("TfdeDynamicTableImport")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("values: float")
    .Input("counts: int64")
    .Input("last_seen: int64")
    .Input("pending_ids: int64")
    .Input("pending_counts: int64")
    .Input("pending_last_seen: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle s;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 3, &s));
      for (int i : {1, 3, 4, 5, 6, 7}) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &s));
      return absl::OkStatus();
    })
    .Doc("Replaces the table's contents with an export's (all checked first).");

class DynamicTableImportOp : public OpKernel {
 public:
  explicit DynamicTableImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicEmbeddingTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    const TableSpec& spec = table->spec();
    const Tensor& ids_t = ctx->input(1);
    const Tensor& values_t = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckIdVector(ids_t));
    const int64_t k = ids_t.NumElements();
    OP_REQUIRES(ctx, values_t.dims() == 3 && values_t.dim_size(0) == k &&
                         values_t.dim_size(1) == spec.num_slots &&
                         values_t.dim_size(2) == spec.dim,
                InvalidArgument("values have shape ", values_t.shape().DebugString(),
                                " but the table needs [", k, ", ", spec.num_slots, ", ",
                                spec.dim, "] (ids, slots, dim)"));
    // Eager calls skip the shape function: every field must be a vector.
    static constexpr const char* kVectorFields[] = {
        "counts", "last_seen", "pending_ids", "pending_counts", "pending_last_seen"};
    for (int i = 3; i <= 7; ++i) {
      OP_REQUIRES_OK(ctx, CheckIdVector(ctx->input(i), kVectorFields[i - 3]));
    }
    const int64_t p = ctx->input(5).NumElements();
    struct Size {
      int input;
      const char* name;
      int64_t want;
      const char* of;
    };
    for (const Size& size : {Size{3, "counts", k, "ids"}, Size{4, "last_seen", k, "ids"},
                             Size{6, "pending_counts", p, "pending ids"},
                             Size{7, "pending_last_seen", p, "pending ids"}}) {
      OP_REQUIRES(ctx, ctx->input(size.input).NumElements() == size.want,
                  InvalidArgument(size.name, " has ", ctx->input(size.input).NumElements(),
                                  " entries for ", size.want, " ", size.of));
    }
    const int64_t* ids = ids_t.flat<int64_t>().data();
    const int64_t* pids = ctx->input(5).flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, CheckImportIds(ids, k, pids, p));
    mutex_lock lock(*table->mu());
    table->Clear();
    const int64_t width = spec.dim * spec.num_slots;
    const float* values = values_t.flat<float>().data();
    const int64_t* counts = ctx->input(3).flat<int64_t>().data();
    const int64_t* last = ctx->input(4).flat<int64_t>().data();
    for (int64_t i = 0; i < k; ++i) {
      OP_REQUIRES_OK(ctx, table->Restore(ids[i], values + i * width, counts[i], last[i]));
    }
    const int64_t* pcounts = ctx->input(6).flat<int64_t>().data();
    const int64_t* plast = ctx->input(7).flat<int64_t>().data();
    for (int64_t i = 0; i < p; ++i) table->RestorePending(pids[i], pcounts[i], plast[i]);
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdeDynamicTableImport").Device(DEVICE_CPU),
                        DynamicTableImportOp);

REGISTER_OP("TfdeDynamicTableEvict")
    .Input("table: resource")
    .Input("step: int64")
    .Input("max_unseen_steps: int64")
    .Input("max_rows: int64")
    .Output("evicted_ids: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Removes, at `step`, the rows (and not-yet-admitted ids) last seen
`max_unseen_steps` or more steps ago (if > 0), then, while more than
`max_rows` rows remain (if > 0), the least frequently seen rows (ties: the
least recently seen, then the smallest id). Returns the evicted ids, sorted.
)doc");

class DynamicTableEvictOp : public OpKernel {
 public:
  explicit DynamicTableEvictOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicEmbeddingTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    int64_t step, max_unseen, max_rows;
    OP_REQUIRES_OK(ctx, ReadInt64Scalar(ctx, 1, "step", &step));
    OP_REQUIRES_OK(ctx, ReadInt64Scalar(ctx, 2, "max_unseen_steps", &max_unseen));
    OP_REQUIRES_OK(ctx, ReadInt64Scalar(ctx, 3, "max_rows", &max_rows));
    mutex_lock lock(*table->mu());
    const std::vector<int64_t> evicted = table->Evict(step, max_unseen, max_rows);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(evicted.size())}), &out));
    std::copy(evicted.begin(), evicted.end(), out->flat<int64_t>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdeDynamicTableEvict").Device(DEVICE_CPU),
                        DynamicTableEvictOp);

REGISTER_OP("TfdeDynamicTableStats")
    .Input("table: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(3));
      return absl::OkStatus();
    })
    .Doc("[live rows, ids pending admission, bytes of host memory held].");

class DynamicTableStatsOp : public OpKernel {
 public:
  explicit DynamicTableStatsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicEmbeddingTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    tf_shared_lock lock(*table->mu());
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({3}), &out));
    auto stats = out->flat<int64_t>();
    stats(0) = table->size();
    stats(1) = table->pending_size();
    stats(2) = static_cast<int64_t>(table->Bytes());
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdeDynamicTableStats").Device(DEVICE_CPU),
                        DynamicTableStatsOp);

}  // namespace tfde
