// The ops of dynamic embedding tables (dynamic_table.h): the resource's
// handle, lookup, the sparse optimizers' updates, export, import, eviction
// and stats. CPU kernels: the table lives in host memory.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "device.h"
#include "dynamic_table.h"
#include "input_checks.h"
#include "sparse_updates.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/platform/mutex.h"

namespace tfde {

using ::tensorflow::DT_INT64;
using ::tensorflow::ResourceHandle;
using ::tensorflow::mutex_lock;
using ::tensorflow::tf_shared_lock;
using ::tensorflow::core::RefCountPtr;

// ---- ops

REGISTER_OP("TfdeDynamicTableHandle")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .Attr("dim: int >= 1")
    .Attr("slot_initial_values: list(float) = []")
    .Attr("initializer: {'zeros', 'constant', 'uniform', 'normal', 'truncated_normal'}")
    .Attr("initializer_a: float = 0.0")
    .Attr("initializer_b: float = 0.0")
    .Attr("seed: int = 0")
    .Attr("admit_after: int >= 1 = 1")
    .Attr("zeros_until_admitted: bool = false")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (on first use) or finds the dynamic table `shared_name`: rows of
`dim` floats for the embedding, plus one row per optimizer slot, each slot
starting at its entry of `slot_initial_values`. A new id's embedding starts
at `initializer` (a, b: constant; min, max; mean, stddev) as a function of
(seed, id, column). An id gets a row on its `admit_after`-th sighting; until
then lookups give its initial value (or zeros) and store nothing.
)doc");

class DynamicTableHandleOp : public OpKernel {
 public:
  explicit DynamicTableHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    OP_REQUIRES(ctx, !shared_name_.empty(),
                InvalidArgument("a dynamic table needs a shared_name"));
    std::string init;
    float a, b;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &spec_.dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_initial_values", &spec_.slot_initial));
    spec_.num_slots = 1 + static_cast<int>(spec_.slot_initial.size());
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &init));
    OP_REQUIRES_OK(ctx, ParseInitKind(init, &spec_.init));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer_a", &a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer_b", &b));
    spec_.init_a = a;
    spec_.init_b = b;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &spec_.seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit_after", &spec_.admit_after));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("zeros_until_admitted", &spec_.zeros_until_admitted));
    // A row's width in floats must be a size: at most 2^40 (4 TiB a row).
    OP_REQUIRES(ctx, spec_.dim <= (int64_t{1} << 40) / spec_.num_slots,
                InvalidArgument("dim = ", spec_.dim, " with ", spec_.num_slots,
                                " slots is too wide a row"));
  }

  void Compute(OpKernelContext* ctx) override {
    // The handle names the resource manager's default container when none
    // is given; create the table where the handle will look.
    const std::string container =
        container_.empty() ? ctx->resource_manager()->default_container() : container_;
    DynamicEmbeddingTable* table = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<DynamicEmbeddingTable>(
                            container, shared_name_, &table,
                            [this](DynamicEmbeddingTable** out) {
                              *out = new DynamicEmbeddingTable(spec_);
                              return absl::OkStatus();
                            }));
    const TableSpec& have = table->spec();
    const bool same = have.dim == spec_.dim && have.num_slots == spec_.num_slots;
    table->Unref();
    OP_REQUIRES(ctx, same,
                InvalidArgument("dynamic table ", shared_name_, " exists with dim ", have.dim,
                                " and ", have.num_slots, " slots; asked for dim ", spec_.dim,
                                " and ", spec_.num_slots, " slots"));
    Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<ResourceHandle>()() =
        tensorflow::MakeResourceHandle<DynamicEmbeddingTable>(ctx, container, shared_name_);
  }

 private:
  std::string container_, shared_name_;
  TableSpec spec_;
};

REGISTER_KERNEL_BUILDER(Name("TfdeDynamicTableHandle").Device(DEVICE_CPU),
                        DynamicTableHandleOp);

Status LookupTable(OpKernelContext* ctx, int input, RefCountPtr<DynamicEmbeddingTable>* out) {
  DynamicEmbeddingTable* table = nullptr;
  TF_RETURN_IF_ERROR(
      LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), &table));
  out->reset(table);
  return absl::OkStatus();
}

REGISTER_OP("TfdeDynamicTableLookup")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("counts: int64")
    .Input("step: int64")
    .Output("rows: float")
    .Output("addresses: int64")
    .Attr("dim: int >= 1")
    .Attr("insert: bool")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle ids, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &ids));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &unused));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(ids, 0), dim));
      c->set_output(1, ids);
      return absl::OkStatus();
    })
    .Doc(R"doc(
The embeddings of `ids` (repeats allowed), and the address of each id's row
after this lookup (-1 for ids without a row), read under the same lock
(mxRec's flow applies gradients by address). With `insert` (training), each
id counts `counts[i]` sightings at `step`, and an id admitted by them gets
its row now; without (inference), nothing changes. Ids without a row give
their initial value, or zeros if the table says so.
)doc");

class DynamicTableLookupOp : public OpKernel {
 public:
  explicit DynamicTableLookupOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicEmbeddingTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    const Tensor& ids_t = ctx->input(1);
    const Tensor& counts_t = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckIdVector(ids_t));
    const int64_t n = ids_t.NumElements();
    // Eager calls skip the shape function: a [n, 1] count would otherwise
    // pass the size check below.
    if (insert_) OP_REQUIRES_OK(ctx, CheckIdVector(counts_t, "counts"));
    OP_REQUIRES(ctx, !insert_ || counts_t.NumElements() == n,
                InvalidArgument("counts has ", counts_t.NumElements(),
                                " entries but there are ", n, " ids"));
    int64_t step;
    OP_REQUIRES_OK(ctx, ReadInt64Scalar(ctx, 3, "step", &step));
    const TableSpec& spec = table->spec();
    const int64_t dim = spec.dim;
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim}), &out_t));
    const int64_t* ids = ids_t.flat<int64_t>().data();
    float* out = out_t->flat<float>().data();
    Tensor* addresses_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &addresses_t));
    int64_t* row_of = addresses_t->flat<int64_t>().data();
    auto copy_rows = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        if (i + kPrefetchDistance < i1 && row_of[i + kPrefetchDistance] >= 0) {
          PrefetchRow(table->Values(row_of[i + kPrefetchDistance]),
                      dim * sizeof(float), false);
        }
        float* o = out + i * dim;
        if (row_of[i] >= 0) {
          std::copy_n(table->Values(row_of[i]), dim, o);
        } else if (spec.zeros_until_admitted) {
          std::fill_n(o, dim, 0.0f);
        } else {
          InitialValue(spec, ids[i], o);
        }
      }
    };
    if (insert_) {
      // Sightings and insertions change the index: one writer.
      mutex_lock lock(*table->mu());
      const int64_t* counts = counts_t.flat<int64_t>().data();
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES_OK(ctx, table->See(ids[i], counts[i], step, &row_of[i]));
      }
      // An id admitted by a later repeat in this call is served from its
      // row everywhere in the call, whatever the order of the repeats.
      for (int64_t i = 0; i < n; ++i) {
        if (row_of[i] < 0) row_of[i] = table->FindRow(ids[i]);
      }
      ParallelFor(ctx, n, dim * 4, copy_rows);
    } else {
      tf_shared_lock lock(*table->mu());
      for (int64_t i = 0; i < n; ++i) row_of[i] = table->FindRow(ids[i]);
      ParallelFor(ctx, n, dim * 4, copy_rows);
    }
  }

 private:
  bool insert_;
};

REGISTER_KERNEL_BUILDER(Name("TfdeDynamicTableLookup").Device(DEVICE_CPU),
                        DynamicTableLookupOp);

// The sparse optimizers over dynamic tables: ids must be unique; ids with no
// row (not admitted, or evicted since the lookup) are skipped.
// With `by_address`, `ids` are row addresses from TfdeDynamicTableLookup
// (mxRec's flow): -1 (an id without a row) is skipped, and an address that
// is not a live row is an error.
#define TFDE_DYNAMIC_APPLY_COMMON_INPUTS \
  .Input("table: resource")              \
  .Input("ids: int64")                   \
  .Input("grad: float")                  \
  .Input("grad_rows: Tgrad_rows")        \
  .Attr("Tgrad_rows: {int32, int64} = DT_INT32") \
  .Attr("by_address: bool = false")

template <int kNumScalars>
Status DynamicApplyShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle s;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &s));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &s));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &s));
  for (int i = 0; i < kNumScalars; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(4 + i), 0, &s));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

REGISTER_OP("TfdeDynamicTableApplySgd")
    TFDE_DYNAMIC_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Output("applied: int64")
    .SetIsStateful()
    .SetShapeFn(DynamicApplyShape<1>);
REGISTER_OP("TfdeDynamicTableApplyAdagrad")
    TFDE_DYNAMIC_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Input("epsilon: float")
    .Output("applied: int64")
    .SetIsStateful()
    .SetShapeFn(DynamicApplyShape<2>);
REGISTER_OP("TfdeDynamicTableApplyLazyAdam")
    TFDE_DYNAMIC_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Input("beta_1: float")
    .Input("beta_2: float")
    .Input("epsilon: float")
    .Input("step: float")
    .Output("applied: int64")
    .SetIsStateful()
    .SetShapeFn(DynamicApplyShape<5>);
REGISTER_OP("TfdeDynamicTableApplyFtrl")
    TFDE_DYNAMIC_APPLY_COMMON_INPUTS
    .Input("learning_rate: float")
    .Input("l1: float")
    .Input("l2: float")
    .Input("l2_shrinkage: float")
    .Input("beta: float")
    .Input("learning_rate_power: float")
    .Output("applied: int64")
    .SetIsStateful()
    .SetShapeFn(DynamicApplyShape<6>);
#undef TFDE_DYNAMIC_APPLY_COMMON_INPUTS

template <typename Update>
class DynamicTableApplyOp : public OpKernel {
 public:
  explicit DynamicTableApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("by_address", &by_address_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicEmbeddingTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    typename Update::Params params;
    OP_REQUIRES_OK(ctx, Update::ReadParams(ctx, 4, &params));
    const Tensor& ids_t = ctx->input(1);
    const Tensor& grad_t = ctx->input(2);
    const Tensor& grad_rows_t = ctx->input(3);
    bool select;
    OP_REQUIRES_OK(ctx, CheckUpdateInputs(ids_t, grad_t, grad_rows_t, "ids", &select));
    OP_REQUIRES_OK(ctx, CheckIndexRange<CPUDevice>(ctx, grad_rows_t, "grad_rows",
                                                   grad_t.dim_size(0)));
    Tensor narrowed_grad_rows;
    const int32_t* grad_rows_32;
    OP_REQUIRES_OK(ctx, Int32View(ctx, grad_rows_t, &narrowed_grad_rows, &grad_rows_32));
    const TableSpec& spec = table->spec();
    OP_REQUIRES(ctx, spec.num_slots == Update::kNumVars,
                InvalidArgument("the table keeps ", spec.num_slots - 1,
                                " optimizer slots but this optimizer needs ",
                                Update::kNumVars - 1));
    OP_REQUIRES(ctx, grad_t.dim_size(1) == spec.dim,
                InvalidArgument("grad has width ", grad_t.dim_size(1),
                                " but the table has width ", spec.dim));
    const int64_t n = ids_t.NumElements();
    const int32_t* grad_rows = select ? grad_rows_32 : nullptr;
    const int64_t* ids = ids_t.flat<int64_t>().data();
    const char* what = by_address_ ? "addresses" : "ids";
    IdIndexMap<int64_t> seen(n);
    for (int64_t i = 0; i < n; ++i) {
      if (by_address_ && ids[i] == -1) continue;  // ids without a row
      bool inserted;
      const int32_t first = seen.FindOrInsert(ids[i], static_cast<int32_t>(i), &inserted);
      OP_REQUIRES(ctx, inserted,
                  InvalidArgument(what, "[", i, "] = ", ids[i], " repeats ", what, "[",
                                  first, "]; sum the gradients of an id before "
                                  "applying them"));
    }
    mutex_lock lock(*table->mu());
    Tensor row_of_t;
    int64_t* row_of;
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, n, &row_of_t, &row_of));
    int64_t applied = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (by_address_) {
        OP_REQUIRES(ctx, ids[i] == -1 || table->IsLiveRow(ids[i]),
                    InvalidArgument("addresses[", i, "] = ", ids[i],
                                    " is not a row of the table (addresses come from "
                                    "this step's lookup; -1 marks an id without a row)"));
        row_of[i] = ids[i];
      } else {
        row_of[i] = table->FindRow(ids[i]);
      }
      applied += row_of[i] >= 0;
    }
    const int64_t dim = spec.dim;
    const float* grad = grad_t.flat<float>().data();
    const auto rows_of = [&](int64_t i, float** rows) {
      if (row_of[i] < 0) return false;
      float* base = table->Values(row_of[i]);
      for (int v = 0; v < Update::kNumVars; ++v) rows[v] = base + v * dim;
      return true;
    };
    const auto grad_of = [&](int64_t i, float* /*scratch*/) {
      return grad + (grad_rows ? grad_rows[i] : i) * dim;
    };
    ParallelFor(ctx, n, dim * 12, [&](int64_t i0, int64_t i1) {
      UpdateRows<Update>(params, i0, i1, dim, grad_of, rows_of);
    });
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = applied;
  }

 private:
  bool by_address_;
};

#define TFDE_REGISTER_DYNAMIC_APPLY(op_name, Update)                                \
  REGISTER_KERNEL_BUILDER(Name(op_name).Device(DEVICE_CPU), DynamicTableApplyOp<Update>);
TFDE_REGISTER_DYNAMIC_APPLY("TfdeDynamicTableApplySgd", SgdUpdate)
TFDE_REGISTER_DYNAMIC_APPLY("TfdeDynamicTableApplyAdagrad", AdagradUpdate)
TFDE_REGISTER_DYNAMIC_APPLY("TfdeDynamicTableApplyLazyAdam", LazyAdamUpdate)
TFDE_REGISTER_DYNAMIC_APPLY("TfdeDynamicTableApplyFtrl", FtrlUpdate)
#undef TFDE_REGISTER_DYNAMIC_APPLY

// Both exports have these outputs; the second filters by last_seen.
Status ExportShape(shape_inference::InferenceContext* c) {
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->UnknownShapeOfRank(3));
  for (int i = 2; i < 7; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

REGISTER_OP("TfdeDynamicTableExport")
    .Input("table: resource")
    .Output("ids: int64")
    .Output("values: float")
    .Output("counts: int64")
    .Output("last_seen: int64")
    .Output("pending_ids: int64")
    .Output("pending_counts: int64")
    .Output("pending_last_seen: int64")
    .SetIsStateful()
    .SetShapeFn(ExportShape)
    .Doc(R"doc(
Every row, sorted by id: values[k] is [slots, dim] (the embedding, then the
optimizer slots), with its sighting count and the step it was last seen;
and the ids seen but not admitted yet, with their counts and steps.
)doc");

REGISTER_OP("TfdeDynamicTableExportSeenAfter")
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
      return ExportShape(c);
    })
    .Doc(R"doc(
As TfdeDynamicTableExport, but only the rows last seen after step
`seen_after` (a delta's changed rows: its time follows them, not the live
rows); the pending ids whole, as they are few and carry no rows.
)doc");

// kSeenAfter: the op takes the step to filter by as its second input.
template <bool kSeenAfter>
class DynamicTableExportOp : public OpKernel {
 public:
  explicit DynamicTableExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t seen_after = std::numeric_limits<int64_t>::min();
    if (kSeenAfter) {
      const Tensor& step = ctx->input(1);
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step.shape()),
                  InvalidArgument("seen_after must be a scalar step, got shape ",
                                          step.shape().DebugString()));
      seen_after = step.scalar<int64_t>()();
    }
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
                        DynamicTableExportOp<false>);
REGISTER_KERNEL_BUILDER(Name("TfdeDynamicTableExportSeenAfter").Device(DEVICE_CPU),
                        DynamicTableExportOp<true>);

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
