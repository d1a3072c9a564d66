// The CUDA launchers of embedding_kernels.cu.h that need no sorting:
// gathers from a group's tables, the combine (of gathered rows, or straight
// from the tables) and its coefficients, and the sparse optimizers' row
// updates. (embedding_kernels.cu.cc has the ones
// built on CUB's sorts: checks for repeats, unique, partition, the combine's
// gradient.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "embedding_kernels.cu.h"
#include "launch_helpers.cu.h"

namespace tfde {
namespace gpu {
namespace {

// ---- gather ----

// The start of group row r in its table, or nullptr when r lies outside
// the group's tables: the last table whose base is <= r, by binary search
// (a launch holds up to kMaxTablesPerLaunch tables).
__device__ __forceinline__ const float* RowInGroup(const TableGroup& group, int64_t dim,
                                                   int64_t r) {
  if (r < group.base[0] || r >= group.end) return nullptr;
  int lo = 0, hi = group.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (group.base[mid] <= r) lo = mid; else hi = mid - 1;
  }
  return group.data[lo] + (r - group.base[lo]) * dim;
}

template <typename Index>
__global__ void GatherKernel(const TableGroup group, int64_t dim, const Index* rows,
                             int64_t n, float* out) {
  TFDE_GRID_STRIDE(e, n * dim) {
    const int64_t i = e / dim;
    const int64_t d = e - i * dim;
    const float* row = RowInGroup(group, dim, static_cast<int64_t>(rows[i]));
    if (row) out[e] = row[d];
  }
}

// `kVector` consecutive floats of a row, moved as one load where kVector is
// 4 (the launcher checks the alignment).
template <int kVector>
struct Floats {
  float v[kVector];
  __device__ __forceinline__ void Load(const float* p) {
    if constexpr (kVector == 4) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(p));
      v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
    } else {
      for (int k = 0; k < kVector; ++k) v[k] = __ldg(p + k);
    }
  }
  __device__ __forceinline__ void Store(float* p) const {
    if constexpr (kVector == 4) {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      for (int k = 0; k < kVector; ++k) p[k] = v[k];
    }
  }
};

// One thread per kVector columns of a sample: the ids' rows are read
// straight from their tables, each once per id, and never written back, so
// the memory traffic is the rows read plus the outputs written (as torch's
// EmbeddingBag), where gather-then-combine also wrote and re-read every row.
template <typename Index, typename Split, int kVector>
__global__ void CombineFromTablesKernel(const TableGroup group, int64_t dim, const Index* rows,
                                        const int32_t* inverse, const Split* splits,
                                        int64_t batch, const float* coefficient,
                                        bool accumulate, float* out) {
  const int64_t lanes = dim / kVector;
  TFDE_GRID_STRIDE(e, batch * lanes) {
    const int64_t b = e / lanes;
    const int64_t d = (e - b * lanes) * kVector;
    float acc[kVector] = {};
    const int64_t end = splits[b + 1];
#pragma unroll 4
    for (int64_t i = splits[b]; i < end; ++i) {
      const float* row = RowInGroup(group, dim, static_cast<int64_t>(rows[inverse[i]]));
      if (!row) continue;
      Floats<kVector> x;
      x.Load(row + d);
      const float w = coefficient[i];
      for (int k = 0; k < kVector; ++k) acc[k] += w * x.v[k];
    }
    float* o = out + b * dim + d;
    Floats<kVector> result;
    if (accumulate) result.Load(o);  // an earlier launch's tables' sums
    for (int k = 0; k < kVector; ++k) result.v[k] = accumulate ? result.v[k] + acc[k] : acc[k];
    result.Store(o);
  }
}

// ---- combine ----

template <typename Split>
__global__ void CoefficientsKernel(const Split* splits, int64_t batch, const float* weights,
                                   Combiner combiner, int32_t* bag_of, float* coefficient) {
  // One warp per sample.
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       b < batch; b += warps) {
    const int64_t begin = splits[b], end = splits[b + 1];
    double sum = 0.0, sum_sq = 0.0;
    for (int64_t i = begin + lane; i < end; i += 32) {
      const double w = weights ? weights[i] : 1.0;
      sum += w;
      sum_sq += w * w;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
      sum_sq += __shfl_down_sync(0xffffffffu, sum_sq, offset);
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    sum_sq = __shfl_sync(0xffffffffu, sum_sq, 0);
    double scale = 1.0;
    if (combiner == Combiner::kMean) {
      scale = sum == 0.0 ? 0.0 : 1.0 / sum;
    } else if (combiner == Combiner::kSqrtn) {
      scale = sum_sq == 0.0 ? 0.0 : 1.0 / sqrt(sum_sq);
    }
    for (int64_t i = begin + lane; i < end; i += 32) {
      coefficient[i] = static_cast<float>((weights ? weights[i] : 1.0) * scale);
      bag_of[i] = static_cast<int32_t>(b);
    }
  }
}

template <typename T, typename Split>
__global__ void CombineKernel(const T* rows, int64_t dim, const int32_t* inverse,
                              const Split* splits, int64_t batch, const float* coefficient,
                              T* out) {
  TFDE_GRID_STRIDE(e, batch * dim) {
    const int64_t b = e / dim;
    const int64_t d = e - b * dim;
    float acc = 0.0f;
    for (int64_t i = splits[b]; i < splits[b + 1]; ++i) {
      acc += coefficient[i] * ToFloat(rows[static_cast<int64_t>(inverse[i]) * dim + d]);
    }
    out[e] = FromFloat<T>(acc);
  }
}

// ---- optimizers ----

struct VarPointers {
  float* v[3];
};

__device__ __forceinline__ void ApplyElement(const SgdParams& p, const VarPointers&,
                                             int64_t at, float* w, float g) {
  w[at] -= p.lr * g;
}

__device__ __forceinline__ void ApplyElement(const AdagradParams& p, const VarPointers& vars,
                                             int64_t at, float* w, float g) {
  float* acc = vars.v[1];
  acc[at] += g * g;
  w[at] -= p.lr * g / sqrtf(acc[at] + p.epsilon);
}

__device__ __forceinline__ void ApplyElement(const LazyAdamParams& p, const VarPointers& vars,
                                             int64_t at, float* w, float g) {
  float* m = vars.v[1];
  float* v = vars.v[2];
  m[at] += (g - m[at]) * (1.0f - p.beta_1);
  v[at] += (g * g - v[at]) * (1.0f - p.beta_2);
  w[at] -= m[at] * p.alpha / (sqrtf(v[at]) + p.epsilon);
}

__device__ __forceinline__ void ApplyElement(const FtrlParams& p, const VarPointers& vars,
                                             int64_t at, float* w, float g) {
  float* acc = vars.v[1];
  float* linear = vars.v[2];
  const float grad_to_use = g + 2.0f * p.l2_shrinkage * w[at];
  const float new_acc = acc[at] + g * g;
  const float new_acc_pow = powf(new_acc, -p.lr_power);
  linear[at] += grad_to_use - (new_acc_pow - powf(acc[at], -p.lr_power)) / p.lr * w[at];
  const float quadratic = new_acc_pow / p.lr + 2.0f * p.l2_total;
  const float clipped = fminf(fmaxf(linear[at], -p.l1), p.l1);
  w[at] = (clipped - linear[at]) / quadratic;
  acc[at] = new_acc;
}

template <typename Index, typename Params>
__global__ void SparseApplyKernel(const Params params, const VarPointers vars, int64_t dim,
                                  const Index* indices, int64_t n, const float* grad,
                                  const int32_t* grad_rows) {
  TFDE_GRID_STRIDE(e, n * dim) {
    const int64_t i = e / dim;
    const int64_t d = e - i * dim;
    const int64_t g_row = grad_rows ? grad_rows[i] : i;
    ApplyElement(params, vars, static_cast<int64_t>(indices[i]) * dim + d, vars.v[0],
                 grad[g_row * dim + d]);
  }
}

}  // namespace

template <typename Index>
cudaError_t GatherFromTables(cudaStream_t stream, const TableGroup& group, int64_t dim,
                             const Index* rows, int64_t n, float* out) {
  if (n == 0 || dim == 0) return cudaSuccess;
  GatherKernel<<<BlocksFor(n * dim), kThreads, 0, stream>>>(group, dim, rows, n, out);
  return cudaGetLastError();
}

template <typename Index, typename Split>
cudaError_t CombineFromTables(cudaStream_t stream, const TableGroup& group, int64_t dim,
                              const Index* rows, const int32_t* inverse, const Split* splits,
                              int64_t batch, const float* coefficient, bool accumulate,
                              float* out) {
  if (batch == 0 || dim == 0) return cudaSuccess;
  // Whole float4 loads where every row and output starts 16-byte aligned.
  bool aligned = dim % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  for (int t = 0; t < group.count; ++t) {
    aligned = aligned && reinterpret_cast<uintptr_t>(group.data[t]) % 16 == 0;
  }
  if (aligned) {
    CombineFromTablesKernel<Index, Split, 4><<<BlocksFor(batch * dim / 4), kThreads, 0, stream>>>(
        group, dim, rows, inverse, splits, batch, coefficient, accumulate, out);
  } else {
    CombineFromTablesKernel<Index, Split, 1><<<BlocksFor(batch * dim), kThreads, 0, stream>>>(
        group, dim, rows, inverse, splits, batch, coefficient, accumulate, out);
  }
  return cudaGetLastError();
}

template <typename Split>
cudaError_t CombineCoefficients(cudaStream_t stream, const Split* splits, int64_t batch,
                                const float* weights, Combiner combiner, int32_t* bag_of,
                                float* coefficient) {
  if (batch == 0) return cudaSuccess;
  CoefficientsKernel<<<BlocksFor(batch * 32), kThreads, 0, stream>>>(
      splits, batch, weights, combiner, bag_of, coefficient);
  return cudaGetLastError();
}

template <typename T, typename Split>
cudaError_t EmbeddingCombine(cudaStream_t stream, const T* rows, int64_t dim,
                             const int32_t* inverse, const Split* splits, int64_t batch,
                             const float* coefficient, T* out) {
  if (batch == 0 || dim == 0) return cudaSuccess;
  CombineKernel<<<BlocksFor(batch * dim), kThreads, 0, stream>>>(
      rows, dim, inverse, splits, batch, coefficient, out);
  return cudaGetLastError();
}

template <typename Index, typename Params>
cudaError_t SparseApply(cudaStream_t stream, const Params& params, float* const* vars,
                        int64_t dim, const Index* indices, int64_t n, const float* grad,
                        const int32_t* grad_rows) {
  if (n == 0 || dim == 0) return cudaSuccess;
  VarPointers pointers{{vars[0], nullptr, nullptr}};
  constexpr int kSlots = std::is_same<Params, SgdParams>::value       ? 0
                         : std::is_same<Params, AdagradParams>::value ? 1
                                                                      : 2;
  for (int s = 1; s <= kSlots; ++s) pointers.v[s] = vars[s];
  SparseApplyKernel<Index, Params><<<BlocksFor(n * dim), kThreads, 0, stream>>>(
      params, pointers, dim, indices, n, grad, grad_rows);
  return cudaGetLastError();
}

#define TFDE_INSTANTIATE_ID(Id)                                                         \
  template cudaError_t GatherFromTables<Id>(cudaStream_t, const TableGroup&, int64_t,   \
                                            const Id*, int64_t, float*);                \
  template cudaError_t CombineCoefficients<Id>(cudaStream_t, const Id*, int64_t,        \
                                               const float*, Combiner, int32_t*,        \
                                               float*);                                 \
  template cudaError_t SparseApply<Id, SgdParams>(cudaStream_t, const SgdParams&,       \
                                                  float* const*, int64_t, const Id*,    \
                                                  int64_t, const float*, const int32_t*); \
  template cudaError_t SparseApply<Id, AdagradParams>(                                  \
      cudaStream_t, const AdagradParams&, float* const*, int64_t, const Id*, int64_t,   \
      const float*, const int32_t*);                                                    \
  template cudaError_t SparseApply<Id, LazyAdamParams>(                                 \
      cudaStream_t, const LazyAdamParams&, float* const*, int64_t, const Id*, int64_t,  \
      const float*, const int32_t*);                                                    \
  template cudaError_t SparseApply<Id, FtrlParams>(cudaStream_t, const FtrlParams&,     \
                                                   float* const*, int64_t, const Id*,   \
                                                   int64_t, const float*, const int32_t*);
TFDE_INSTANTIATE_ID(int32_t)
TFDE_INSTANTIATE_ID(int64_t)
#undef TFDE_INSTANTIATE_ID

#define TFDE_INSTANTIATE_COMBINE_FROM_TABLES(Index, Split)                              \
  template cudaError_t CombineFromTables<Index, Split>(                                  \
      cudaStream_t, const TableGroup&, int64_t, const Index*, const int32_t*, const Split*, \
      int64_t, const float*, bool, float*);
TFDE_INSTANTIATE_COMBINE_FROM_TABLES(int32_t, int32_t)
TFDE_INSTANTIATE_COMBINE_FROM_TABLES(int32_t, int64_t)
TFDE_INSTANTIATE_COMBINE_FROM_TABLES(int64_t, int32_t)
TFDE_INSTANTIATE_COMBINE_FROM_TABLES(int64_t, int64_t)
#undef TFDE_INSTANTIATE_COMBINE_FROM_TABLES

#define TFDE_INSTANTIATE_ROWS(T)                                                        \
  template cudaError_t EmbeddingCombine<T, int32_t>(cudaStream_t, const T*, int64_t,    \
                                                    const int32_t*, const int32_t*,     \
                                                    int64_t, const float*, T*);         \
  template cudaError_t EmbeddingCombine<T, int64_t>(cudaStream_t, const T*, int64_t,    \
                                                    const int32_t*, const int64_t*,     \
                                                    int64_t, const float*, T*);
TFDE_INSTANTIATE_ROWS(float)
TFDE_INSTANTIATE_ROWS(__half)
TFDE_INSTANTIATE_ROWS(__nv_bfloat16)
#undef TFDE_INSTANTIATE_ROWS

}  // namespace gpu
}  // namespace tfde
