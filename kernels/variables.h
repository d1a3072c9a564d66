// Resource variables as tfde's kernels use them: looked up from the op's
// inputs, locked in one global (address) order so that concurrent reads and
// updates of overlapping variables never deadlock, and checked to be
// initialised float32 matrices.
#ifndef TFDE_KERNELS_VARIABLES_H_
#define TFDE_KERNELS_VARIABLES_H_

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tfde {

using ::tensorflow::Var;
using ::tensorflow::core::RefCountPtr;
using ::tensorflow::errors::FailedPrecondition;

enum class LockMode { kShared, kExclusive };

// A dtype as Python spells it (tf.float64, not C++'s "double"), for messages
// that the twins raise too.
inline std::string DTypeName(tensorflow::DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_FLOAT:
      return "float32";
    case tensorflow::DT_DOUBLE:
      return "float64";
    case tensorflow::DT_HALF:
      return "float16";
    default:
      return tensorflow::DataTypeString(dtype);
  }
}

class LockedVariables {
 public:
  LockedVariables() = default;
  LockedVariables(const LockedVariables&) = delete;
  LockedVariables& operator=(const LockedVariables&) = delete;
  ~LockedVariables() {
    for (Var* v : locked_) {
      if (mode_ == LockMode::kShared) {
        v->mu()->unlock_shared();
      } else {
        v->mu()->unlock();
      }
    }
  }

  // Looks up inputs [first, first + count) and locks them; each must be
  // initialized and of `dtype` and rank `dims` (the tables' float32
  // matrices unless an op says otherwise).
  Status Acquire(OpKernelContext* ctx, int first, int count, LockMode mode,
                 tensorflow::DataType dtype = tensorflow::DT_FLOAT, int dims = 2) {
    mode_ = mode;
    for (int i = first; i < first + count; ++i) {
      Var* var = nullptr;
      TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, i), &var));
      vars_.emplace_back(var);
    }
    std::vector<Var*> order;
    for (auto& v : vars_) order.push_back(v.get());
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    for (Var* v : order) {
      if (mode == LockMode::kShared) {
        v->mu()->lock_shared();
      } else {
        v->mu()->lock();
      }
      locked_.push_back(v);
    }
    for (int k = 0; k < count; ++k) {
      Var* var = vars_[k].get();
      const std::string& name = HandleFromInput(ctx, first + k).name();
      if (!var->is_initialized) {
        return FailedPrecondition("variable ", name, " is not initialised");
      }
      if (var->tensor()->dtype() != dtype || var->tensor()->dims() != dims) {
        return InvalidArgument("variable ", name, " must be a ", DTypeName(dtype),
                               dims == 2 ? " matrix" : " vector", ", got ",
                               DTypeName(var->tensor()->dtype()),
                               " ", var->tensor()->shape().DebugString());
      }
    }
    return absl::OkStatus();
  }

  // Makes every buffer exclusively ours before writing in place: a buffer
  // still shared with an earlier read is copied once, so that read keeps its
  // value. With `copy_on_read`, as TF's own sparse updates do, later reads
  // copy (copy_on_read_mode), so the next update finds the buffer unshared;
  // without it, reads share the buffer and pay nothing (a mode set
  // earlier stays set: TF never clears it). Needs LockMode::kExclusive.
  // `copy(from, to)` copies a buffer on the variables' device
  // (functor::CopyBuffer).
  using CopyFn = std::function<void(const Tensor& from, Tensor* to)>;
  Status MakeWritable(OpKernelContext* ctx, bool copy_on_read, const CopyFn& copy) {
    for (auto& v : vars_) {
      Var* var = v.get();
      if (copy_on_read) var->copy_on_read_mode.store(true);
      if (!var->tensor()->RefCountIsOne()) {
        Tensor fresh;
        TF_RETURN_IF_ERROR(ctx->allocate_temp(var->tensor()->dtype(),
                                              var->tensor()->shape(), &fresh));
        copy(*var->tensor(), &fresh);
        *var->tensor() = fresh;
      }
    }
    return absl::OkStatus();
  }

  // A sparse update's variables: every slot shaped like the table (the
  // first of the inputs from `first`), and `grad` as wide as its rows.
  Status CheckUpdateTargets(OpKernelContext* ctx, int first, const Tensor& grad) const {
    return CheckUpdateTargets(ctx, first, grad.dim_size(1));
  }
  // slot_width: the slots' row width; 0 for the table's (each slot the
  // table's shape), 1 for a row-wise optimizer's [rows, 1] slots.
  Status CheckUpdateTargets(OpKernelContext* ctx, int first, int64_t grad_dim,
                            int64_t slot_width = 0) const {
    TensorShape slot_shape = tensor(0).shape();
    if (slot_width > 0 && slot_shape.dims() == 2) slot_shape.set_dim(1, slot_width);
    for (int v = 1; v < size(); ++v) {
      if (tensor(v).shape() != slot_shape) {
        return InvalidArgument("slot variable ", HandleFromInput(ctx, first + v).name(),
                               " has shape ", tensor(v).shape().DebugString(),
                               " but the table has ", tensor(0).shape().DebugString(),
                               slot_width > 0 ? ", so the slot must have shape " : "",
                               slot_width > 0 ? slot_shape.DebugString() : "");
      }
    }
    if (grad_dim != dim()) {
      return InvalidArgument("grad has width ", grad_dim, " but the table has width ",
                             dim());
    }
    return absl::OkStatus();
  }

  int size() const { return static_cast<int>(vars_.size()); }
  const Tensor& tensor(int i) const { return *vars_[i]->tensor(); }
  float* Rows(int i) { return Values<float>(i); }
  template <typename T>
  T* Values(int i) { return vars_[i]->tensor()->flat<T>().data(); }
  int64_t num_rows(int i = 0) const { return vars_[i]->tensor()->dim_size(0); }
  int64_t dim(int i = 0) const { return vars_[i]->tensor()->dim_size(1); }

 private:
  LockMode mode_ = LockMode::kExclusive;
  std::vector<RefCountPtr<Var>> vars_;
  std::vector<Var*> locked_;
};

}  // namespace tfde

#endif  // TFDE_KERNELS_VARIABLES_H_
