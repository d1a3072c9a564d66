// TfdeAdviseHugePages: asks Linux to back large variables' buffers with
// transparent huge pages, and to move them there at once.
//
// Embedding tables are read and updated a row at a time at random, so most
// accesses miss the TLB; with 4 KiB pages a 256 MB table spans 65,536 page
// table entries, with 2 MiB pages 128 (bench/ops_bench.py: the forward 6.9
// -> 5.3 to 6.0 ms with its tables advised). TensorFlow
// allocates a variable's buffer and writes it in the same op, so the advice
// comes after the first touch: MADV_HUGEPAGE marks the range, MADV_COLLAPSE
// (Linux 6.1 and later) moves what is already there. Advice only: where
// the kernel refuses (no THP, an older kernel) nothing changes, and the
// values never do.
#include <sys/mman.h>

#include <cstdint>

#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tfde {

REGISTER_OP("TfdeAdviseHugePages")
    .Input("variables: num_variables * resource")
    .Output("advised_bytes: int64")
    .Output("collapsed_bytes: int64")
    .Attr("num_variables: int >= 1")
    .Attr("collapse: bool = true")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Advises the kernel to back each variable's buffer with transparent huge
pages (the whole 2 MiB pages inside it), and with `collapse` to move it
there now. advised_bytes: the bytes the advice covered; collapsed_bytes:
those moved to huge pages. Values are unchanged; a refused advice is not an
error (0 bytes).
)doc");

namespace {

constexpr uintptr_t kHugePageBytes = uintptr_t{2} << 20;
// MADV_COLLAPSE (Linux 6.1); older C headers lack the name.
constexpr int kMadvCollapse = 25;

// The advice on the whole huge pages inside [data, data + bytes).
void AdviseBuffer(const void* data, size_t bytes, bool collapse, int64_t* advised,
                  int64_t* collapsed) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uintptr_t end = (start + bytes) & ~(kHugePageBytes - 1);
  if (end <= begin) return;
  void* range = reinterpret_cast<void*>(begin);
  const size_t length = end - begin;
  if (madvise(range, length, MADV_HUGEPAGE) != 0) return;
  *advised += static_cast<int64_t>(length);
  if (collapse && madvise(range, length, kMadvCollapse) == 0) {
    *collapsed += static_cast<int64_t>(length);
  }
#endif
}

}  // namespace

class AdviseHugePagesOp : public OpKernel {
 public:
  explicit AdviseHugePagesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("collapse", &collapse_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t advised = 0, collapsed = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      tensorflow::Var* var = nullptr;
      OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, i), &var));
      tensorflow::core::ScopedUnref unref(var);
      // Shared: lookups go on; an update that would swap the buffer waits.
      tensorflow::tf_shared_lock lock(*var->mu());
      OP_REQUIRES(ctx, var->is_initialized,
                  tensorflow::errors::FailedPrecondition(
                      "variables[", i, "] is not initialized; advise huge pages after "
                      "creating it"));
      const Tensor& value = *var->tensor();
      AdviseBuffer(value.tensor_data().data(), value.TotalBytes(), collapse_, &advised,
                   &collapsed);
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = advised;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<int64_t>()() = collapsed;
  }

 private:
  bool collapse_;
};

REGISTER_KERNEL_BUILDER(Name("TfdeAdviseHugePages").Device(DEVICE_CPU), AdviseHugePagesOp);

}  // namespace tfde
