#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <sys/mman.h>
static float* big(size_t n) { void* p = aligned_alloc(1 << 21, n * 4); madvise(p, n * 4, MADV_HUGEPAGE); for (size_t i = 0; i < n; ++i) ((float*)p)[i] = (i % 97) * 0.01f; return (float*)p; }
constexpr int D = 64;
static inline void pf(const void* p, int bytes) { for (int b = 0; b < bytes; b += 64) __builtin_prefetch((const char*)p + b, 0, 3); }
// A: runtime dim, acc vector, coefficients
__attribute__((target("avx2"), optimize("fp-contract=off"))) void combA(const int64_t* ids, const float* coef, int64_t b0, int64_t b1, int hot, int64_t dim, const float* W, float* out, int dist) {
  std::vector<float> acc(dim);
  int64_t last = b1 * hot;
  for (int64_t b = b0; b < b1; ++b) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t i = b * hot; i < (b + 1) * hot; ++i) {
      if (i + dist < last) pf(W + ids[i + dist] * dim, dim * 4);
      const float w = coef[i]; const float* row = W + ids[i] * dim;
      for (int64_t d = 0; d < dim; ++d) acc[d] += w * row[d];
    }
    for (int64_t d = 0; d < dim; ++d) out[b * dim + d] = acc[d];
  }
}
// B: compile-time 64, register acc
template <bool kCoef>
__attribute__((target("avx2"), optimize("fp-contract=off"))) void combB(const int64_t* ids, const float* coef, int64_t b0, int64_t b1, int hot, const float* W, float* out, int dist) {
  int64_t last = b1 * hot;
  for (int64_t b = b0; b < b1; ++b) {
    float acc[D] = {};
    for (int64_t i = b * hot; i < (b + 1) * hot; ++i) {
      if (i + dist < last) pf(W + ids[i + dist] * D, D * 4);
      const float* row = W + ids[i] * D;
      if (kCoef) { const float w = coef[i]; for (int d = 0; d < D; ++d) acc[d] += w * row[d]; }
      else for (int d = 0; d < D; ++d) acc[d] += row[d];
    }
    for (int d = 0; d < D; ++d) out[b * D + d] = acc[d];
  }
}
int main() {
  std::vector<int64_t> ids; { FILE* f = fopen("ids.bin", "rb"); int64_t x; while (fread(&x, 8, 1, f) == 1) ids.push_back(x); fclose(f); }
  const int hot = 20; const int64_t batch = ids.size() / hot;
  float* W = big(4000000LL * D);
  std::vector<float> coef(ids.size(), 1.0f), out(batch * D);
  auto run = [&](auto fn, int threads) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for (int k = 0; k < threads; ++k) th.emplace_back([&, k] { fn(batch * k / threads, batch * (k + 1) / threads); });
    for (auto& x : th) x.join();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int round = 0; round < 3; ++round) for (int threads : {1, 2}) {
    printf("threads %d:", threads);
    for (int dist : {8, 16, 32}) {
      double a = 1e9, b = 1e9, c = 1e9;
      for (int r = 0; r < 5; ++r) {
        a = std::min(a, run([&](int64_t b0, int64_t b1) { combA(ids.data(), coef.data(), b0, b1, hot, D, W, out.data(), dist); }, threads));
        b = std::min(b, run([&](int64_t b0, int64_t b1) { combB<true>(ids.data(), coef.data(), b0, b1, hot, W, out.data(), dist); }, threads));
        c = std::min(c, run([&](int64_t b0, int64_t b1) { combB<false>(ids.data(), coef.data(), b0, b1, hot, W, out.data(), dist); }, threads));
      }
      printf("  d%d A %.2f B %.2f C %.2f", dist, a, b, c);
    }
    printf("\n");
  }
}
