// Helpers shared by the CUDA launchers' sources (embedding_kernels.cu.cc,
// dense_kernels.cu.cc): launch geometry, grid-stride loops, error returns
// and the 16-bit float conversions. Internal to kernels/cuda.
#ifndef TFDE_KERNELS_CUDA_LAUNCH_HELPERS_CU_H_
#define TFDE_KERNELS_CUDA_LAUNCH_HELPERS_CU_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tfde {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// Grid-stride loops: enough blocks to fill the device, never more than the
// grid limit.
inline int BlocksFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > (1 << 20) ? (1 << 20) : blocks));
}

#define TFDE_GRID_STRIDE(i, n)                                                  \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

#define TFDE_RETURN_IF_CUDA_ERROR(...)   \
  do {                                  \
    const cudaError_t _err = (__VA_ARGS__); \
    if (_err != cudaSuccess) return _err; \
  } while (0)

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace
}  // namespace gpu
}  // namespace tfde

#endif  // TFDE_KERNELS_CUDA_LAUNCH_HELPERS_CU_H_
