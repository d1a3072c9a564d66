// The devices tfde's op kernels are templated on, and the small functors
// every op class needs on each device: finding the first index out of range,
// reading one element for an error message, and copying a buffer. As in
// TensorFlow's own kernels (gather_op.cc with gather_functor.h), an op class
// parses its attributes, checks its inputs and allocates its outputs once,
// and only the functors it calls differ between CPU and GPU.
//
// A .cc that includes this defines EIGEN_USE_THREADS (and, under GOOGLE_CUDA,
// EIGEN_USE_GPU) before any include, so that both Eigen devices exist. The
// CPU functors are defined here; the GPU ones are declared here and defined
// in cuda/gpu_functors.cc, calling the CUDA launchers.
#ifndef TFDE_KERNELS_DEVICE_H_
#define TFDE_KERNELS_DEVICE_H_

#include <algorithm>
#include <cstring>
#include <limits>

#include "common.h"

namespace tfde {

using CPUDevice = Eigen::ThreadPoolDevice;
#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;
using ::tensorflow::DEVICE_GPU;
#endif

namespace functor {

// The lowest i with values[i] outside [lo, hi), or -1; hi = INT64_MAX
// bounds nothing (a check for negative values).
template <typename Device, typename T>
struct FindOutOfRange;

// Element i of a tensor in Device's memory, on the host (for messages).
template <typename Device, typename T>
struct ReadElement;

// Copies `from` into `to`, both in Device's memory (a variable's buffer made
// exclusively the op's before it is written in place).
template <typename Device>
struct CopyBuffer;

template <typename T>
struct FindOutOfRange<CPUDevice, T> {
  Status operator()(OpKernelContext* ctx, const Tensor& values, int64_t lo, int64_t hi,
                    int64_t* first_bad) const {
    const T* v = values.flat<T>().data();
    const int64_t n = values.NumElements();
    *first_bad = -1;
    const int64_t last =
        hi == std::numeric_limits<int64_t>::max() ? hi : hi - 1;  // inclusive
    const auto out_of_range = [lo, last](T x) {
      return static_cast<int64_t>(x) < lo || static_cast<int64_t>(x) > last;
    };
    // The bounds in parallel vectorized passes (the checks run on every
    // feature of every step); the first offender is searched for only
    // when there is one.
    const auto [smallest, largest] = ParallelMinMax(ctx, v, n);
    if (n == 0 || (!out_of_range(smallest) && !out_of_range(largest))) {
      return absl::OkStatus();
    }
    for (int64_t i = 0; i < n; ++i) {
      if (out_of_range(v[i])) {
        *first_bad = i;
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct ReadElement<CPUDevice, T> {
  T operator()(OpKernelContext* /*ctx*/, const Tensor& t, int64_t i) const {
    return t.flat<T>().data()[i];
  }
};

template <>
struct CopyBuffer<CPUDevice> {
  void operator()(OpKernelContext* /*ctx*/, const Tensor& from, Tensor* to) const {
    std::memcpy(const_cast<char*>(to->tensor_data().data()), from.tensor_data().data(),
                from.TotalBytes());
  }
};

#if GOOGLE_CUDA
template <typename T>
struct FindOutOfRange<GPUDevice, T> {
  Status operator()(OpKernelContext* ctx, const Tensor& values, int64_t lo, int64_t hi,
                    int64_t* first_bad) const;
};
template <typename T>
struct ReadElement<GPUDevice, T> {
  T operator()(OpKernelContext* ctx, const Tensor& t, int64_t i) const;
};
template <>
struct CopyBuffer<GPUDevice> {
  void operator()(OpKernelContext* ctx, const Tensor& from, Tensor* to) const;
};
#endif  // GOOGLE_CUDA

}  // namespace functor

// The ops address at most 2^31 rows: their indices are narrowed to int32
// once checked, so no index past that can be valid.
inline int64_t IndexBound(int64_t bound) { return std::min<int64_t>(bound, int64_t{1} << 31); }

// Checks an index vector (int32 or int64, as its op's attribute allows)
// where it lies: every value in [0, bound), else "name[i] = v is out of
// range [0, bound)", so an int64 value is never wrapped when narrowed.
template <typename Device, typename Index>
Status CheckIndexRangeOf(OpKernelContext* ctx, const Tensor& t, const char* name,
                         int64_t bound) {
  bound = IndexBound(bound);
  int64_t bad;
  TF_RETURN_IF_ERROR(functor::FindOutOfRange<Device, Index>()(ctx, t, 0, bound, &bad));
  if (bad < 0) return absl::OkStatus();
  return InvalidArgument(name, "[", bad, "] = ", functor::ReadElement<Device, Index>()(ctx, t, bad),
                         " is out of range [0, ", bound, ")");
}

template <typename Device>
Status CheckIndexRange(OpKernelContext* ctx, const Tensor& t, const char* name, int64_t bound) {
  return t.dtype() == tensorflow::DT_INT64
             ? CheckIndexRangeOf<Device, int64_t>(ctx, t, name, bound)
             : CheckIndexRangeOf<Device, int32_t>(ctx, t, name, bound);
}

// A checked index vector in host memory as int32: read in place, or an
// int64 one narrowed into scratch (its values were checked first).
inline Status Int32View(OpKernelContext* ctx, const Tensor& t, Tensor* scratch,
                        const int32_t** out) {
  if (t.dtype() == tensorflow::DT_INT32) {
    *out = t.flat<int32_t>().data();
    return absl::OkStatus();
  }
  int32_t* narrow;
  TF_RETURN_IF_ERROR(AllocateScratch(ctx, t.NumElements(), scratch, &narrow));
  const int64_t* wide = t.flat<int64_t>().data();
  for (int64_t i = 0; i < t.NumElements(); ++i) narrow[i] = static_cast<int32_t>(wide[i]);
  *out = narrow;
  return absl::OkStatus();
}

}  // namespace tfde

#endif  // TFDE_KERNELS_DEVICE_H_
