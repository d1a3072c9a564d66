// The ops of dynamic embedding tables (dynamic_table.h) that a training
// step runs: the resource's handle, lookup, the sparse optimizers' updates.
// Export, import, eviction and stats: dynamic_table_state_ops.cc. CPU
// kernels: the table lives in host memory.
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
    // A row (embedding and slots) of at most 2^31 - 1 floats, 8 GiB, far
    // past any embedding; DynamicTableSpec refuses the same for the twin.
    OP_REQUIRES(ctx, spec_.dim <= std::numeric_limits<int32_t>::max() / spec_.num_slots,
                InvalidArgument("dim = ", spec_.dim, " with ", spec_.num_slots,
                                " slots is too wide a row: at most ",
                                std::numeric_limits<int32_t>::max(), " floats"));
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

}  // namespace tfde
