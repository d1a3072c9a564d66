// Shared helpers for tfde's CPU kernels: an id hash map and work splitting.
#ifndef TFDE_KERNELS_COMMON_H_
#define TFDE_KERNELS_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/threadpool.h"

namespace tfde {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::errors::InvalidArgument;
namespace shape_inference = ::tensorflow::shape_inference;

// splitmix64's finaliser: ids in recommendation data are often small
// consecutive integers or multiples of the shard count, so the raw value
// is a poor hash; this spreads every input bit over the whole word.
inline uint64_t MixId(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Open-addressing map from an id to a dense int32 index, sized once for at
// most `max_entries` distinct keys. Linear probing over a power-of-two table
// at load <= 0.5 keeps probes short; no erase is needed by any caller.
template <typename Id>
class IdIndexMap {
 public:
  explicit IdIndexMap(int64_t max_entries) {
    int64_t capacity = 16;
    while (capacity < 2 * max_entries) capacity <<= 1;
    mask_ = capacity - 1;
    // Keys are read only where a value marks the slot used: they need no
    // initialisation (the map is rebuilt per call, so this is half its
    // set-up).
    keys_.reset(new Id[capacity]);
    values_.assign(capacity, -1);
  }

  // Empties the map, keeping its capacity.
  void Clear() { std::fill(values_.begin(), values_.end(), -1); }

  // Returns the index stored for `id`, inserting `next_index` if absent.
  // `inserted` tells the caller which case happened.
  int32_t FindOrInsert(Id id, int32_t next_index, bool* inserted) {
    uint64_t slot = MixId(static_cast<uint64_t>(id)) & mask_;
    while (true) {
      const int32_t v = values_[slot];
      if (v < 0) {
        keys_[slot] = id;
        values_[slot] = next_index;
        *inserted = true;
        return next_index;
      }
      if (keys_[slot] == id) {
        *inserted = false;
        return v;
      }
      slot = (slot + 1) & mask_;
    }
  }

 private:
  uint64_t mask_;
  std::unique_ptr<Id[]> keys_;
  std::vector<int32_t> values_;
};

// Scratch memory of `n` elements of T from TensorFlow's allocator: a size
// that cannot be had is a ResourceExhausted error from the kernel, where a
// std::vector sized from an input would throw past it and end the process.
template <typename T>
Status AllocateScratch(OpKernelContext* ctx, int64_t n, Tensor* tensor, T** data) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DataTypeToEnum<T>::value,
                                        TensorShape({n}), tensor));
  *data = tensor->flat<T>().data();
  return absl::OkStatus();
}

// Runs fn(begin, end) over [0, total) on the op's intra-op thread pool.
// `cost_per_unit` is a rough count of cycles per element, which the pool
// uses to decide how finely to split.
inline void ParallelFor(tensorflow::OpKernelContext* ctx, int64_t total,
                        int64_t cost_per_unit,
                        const std::function<void(int64_t, int64_t)>& fn) {
  if (total <= 0) return;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  workers->ParallelFor(total, cost_per_unit, fn);
}

// The optimizers' row loops are arithmetic-bound once their rows are
// prefetched (Adam's sqrt and divide per element), and TensorFlow's wheels
// are built for baseline x86-64. GCC compiles a function marked with this
// twice, for AVX2+FMA and for baseline x86-64, and picks one when the
// library loads (an ifunc), so the library still loads on any x86-64.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TFDE_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TFDE_VECTOR_CLONES
#endif

// For a loop over a row's entries whose inner loop (over the row's width,
// known when compiled) keeps its sums in registers: GCC's unroll-and-jam
// otherwise fuses two entries' inner loops into one scalar loop through
// memory, which made the bag sums of the optimizers' updates slower than at
// a run-time width (bench/ops_bench.py, GCC 12).
#if defined(__GNUC__) && !defined(__clang__)
#define TFDE_NO_UNROLL_AND_JAM __attribute__((optimize("no-loop-unroll-and-jam")))
#else
#define TFDE_NO_UNROLL_AND_JAM
#endif

// The smallest and largest of values[begin, end), into *lo and *hi. Compiled
// for AVX2 too (TFDE_VECTOR_CLONES): baseline x86-64 has no vector compare
// of 64-bit integers, so an int64 block would be scanned one id at a time.
template <typename T>
TFDE_VECTOR_CLONES void MinMaxOfBlock(const T* values, int64_t begin, int64_t end, T* lo,
                                      T* hi) {
  T smallest = std::numeric_limits<T>::max(), largest = std::numeric_limits<T>::lowest();
  for (int64_t i = begin; i < end; ++i) {
    smallest = std::min(smallest, values[i]);
    largest = std::max(largest, values[i]);
  }
  *lo = smallest;
  *hi = largest;
}

// The smallest and largest of values[0, n) ({max, min} of T when n is 0),
// in parallel blocks whose loops the compiler vectorizes: the kernels'
// range checks, read-only passes over their index inputs.
template <typename T>
std::pair<T, T> ParallelMinMax(tensorflow::OpKernelContext* ctx, const T* values, int64_t n) {
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<T> lo(blocks, std::numeric_limits<T>::max());
  std::vector<T> hi(blocks, std::numeric_limits<T>::lowest());
  ParallelFor(ctx, blocks, kBlock, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      MinMaxOfBlock(values, b * kBlock, std::min(n, (b + 1) * kBlock), &lo[b], &hi[b]);
    }
  });
  T smallest = std::numeric_limits<T>::max(), largest = std::numeric_limits<T>::lowest();
  for (int64_t b = 0; b < blocks; ++b) {
    smallest = std::min(smallest, lo[b]);
    largest = std::max(largest, hi[b]);
  }
  return {smallest, largest};
}

inline int NumWorkerThreads(tensorflow::OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
}

// Asks for the cache lines of a row of `bytes` bytes ahead of their use.
// Rows of a large table are visited in no predictable order, so the
// hardware prefetcher cannot help; a row requested a few iterations early
// overlaps its memory (and page-walk) latency with the work on the rows
// before it. Always inlined: GCC finds a call of it free of side effects
// (a prefetch changes nothing a program can read) and, where it has not
// inlined it early, deletes the call (seen in GCC 12's output).
__attribute__((always_inline)) inline void PrefetchRow(const void* row, int64_t bytes,
                                                       bool for_write) {
  const char* p = static_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += 64) {
    if (for_write) {
      __builtin_prefetch(p + b, 1, 3);
    } else {
      __builtin_prefetch(p + b, 0, 3);
    }
  }
}

// How many rows ahead the gather, combine and update loops prefetch.
constexpr int64_t kPrefetchDistance = 16;
// The combine's: its loop does less per row (a sum), so a row must be asked
// for further ahead to arrive in time (32 against 16: 4.2 against 5.4 ms
// for the bench's 327,680 ids of 64 floats, one thread;
// a combine microbenchmark).
constexpr int64_t kCombinePrefetchDistance = 32;

// Calls fn(std::integral_constant<int, W>()) with W = dim for the common
// row widths, W = 0 for any other (known only at run time). A loop over a
// row whose width is known when compiled keeps the row's sums in
// registers; at a run-time width they go through memory, which costs about
// twice as much per row read (a combine microbenchmark).
template <typename Fn>
void WithCompiledWidth(int64_t dim, const Fn& fn) {
  switch (dim) {
    case 8: return fn(std::integral_constant<int, 8>());
    case 16: return fn(std::integral_constant<int, 16>());
    case 32: return fn(std::integral_constant<int, 32>());
    case 64: return fn(std::integral_constant<int, 64>());
    case 128: return fn(std::integral_constant<int, 128>());
    default: return fn(std::integral_constant<int, 0>());
  }
}

// One row of `dim` floats of scratch: a fixed array where the width is
// known when compiled (kDim > 0, WithCompiledWidth), which the compiler
// may keep in registers across a row's loop, else the heap.
template <int kDim>
class RowScratch {
 public:
  explicit RowScratch(int64_t dim) : heap_(kDim > 0 ? 0 : dim) {}
  RowScratch(const RowScratch&) = delete;
  RowScratch& operator=(const RowScratch&) = delete;
  float* data() { return kDim > 0 ? fixed_ : heap_.data(); }

 private:
  alignas(64) float fixed_[kDim > 0 ? kDim : 1];
  std::vector<float> heap_;
};

// Splits [0, total) into `num_blocks` contiguous blocks; block b is
// [BlockBegin(b), BlockBegin(b + 1)).
struct Blocks {
  int64_t total;
  int64_t num_blocks;
  int64_t Begin(int64_t b) const { return total * b / num_blocks; }
};

}  // namespace tfde

#endif  // TFDE_KERNELS_COMMON_H_
