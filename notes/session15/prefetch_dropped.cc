#include <cstdint>
#include <algorithm>
inline void PrefetchRow(const void* row, int64_t bytes, bool for_write) {
  const char* p = static_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += 64) {
    if (for_write) __builtin_prefetch(p + b, 1, 3); else __builtin_prefetch(p + b, 0, 3);
  }
}
struct BG {
  const float* output_grad; const int64_t* segments; int64_t num_rows; const int32_t* bags; const float* weights; int64_t dim;
  template <int kDim> __attribute__((always_inline))
  void Row(int64_t k, float* out) const {
    const int64_t width = kDim > 0 ? kDim : dim;
    float fixed[kDim > 0 ? kDim : 1];
    float* acc = kDim > 0 ? fixed : out;
    std::fill(acc, acc + width, 0.0f);
    const int64_t entries = segments[num_rows];
    for (int64_t j = segments[k]; j < segments[k + 1]; ++j) {
      PrefetchRow(output_grad + static_cast<int64_t>(bags[j + 32]) * width, width * sizeof(float), false);
      const float c = weights[j];
      const float* g = output_grad + static_cast<int64_t>(bags[j]) * width;
      for (int64_t d = 0; d < width; ++d) acc[d] += c * g[d];
    }
    if (kDim > 0) std::copy(acc, acc + width, out);
  }
};
void f(const BG& b, int64_t k, float* out) { b.Row<64>(k, out); }
