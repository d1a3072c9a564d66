// Adam row updates on 4 tables of 1M x 64 float (w, m, v separate, or
// interleaved), the bench's unique rows; first-occurrence order vs sorted.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <sys/mman.h>
static float* big(size_t n) {
  void* p = aligned_alloc(1 << 21, n * 4);
  madvise(p, n * 4, MADV_HUGEPAGE);
  memset(p, 0, n * 4);
  return (float*)p;
}
constexpr int D = 64;
__attribute__((target("avx2,fma"))) static inline void adam(float* w, float* m, float* v, const float* g) {
  for (int d = 0; d < D; ++d) {
    m[d] += (g[d] - m[d]) * 0.1f;
    v[d] += (g[d] * g[d] - v[d]) * 0.001f;
    w[d] -= m[d] * 0.001f / (std::sqrt(v[d]) + 1e-7f);
  }
}
static inline void pf(const void* p, int bytes) { for (int b = 0; b < bytes; b += 64) __builtin_prefetch((const char*)p + b, 1, 3); }
int main(int argc, char** argv) {
  const int64_t V = 1000000, T = 4;
  std::mt19937_64 rng(1);
  // Zipf(1.05)-like: sample via inverse power, permuted.
  std::vector<int64_t> rows;
  { FILE* f = fopen("rows.bin", "rb"); int64_t x; while (fread(&x, 8, 1, f) == 1) rows.push_back(x); fclose(f); }
  printf("unique rows %zu\n", rows.size());
  float* W = big(T * V * D); float* M = big(T * V * D); float* S = big(T * V * D);
  float* I = big(T * V * D * 3);
  std::vector<float> g(D, 0.01f);
  auto run = [&](const std::vector<int64_t>& order, bool inter, int threads) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for (int k = 0; k < threads; ++k) th.emplace_back([&, k] {
      int64_t n = order.size(), b = n * k / threads, e = n * (k + 1) / threads;
      for (int64_t i = b; i < e; ++i) {
        if (i + 16 < e) {
          int64_t r = order[i + 16];
          if (inter) pf(I + r * 3 * D, 3 * D * 4);
          else { pf(W + r * D, D * 4); pf(M + r * D, D * 4); pf(S + r * D, D * 4); }
        }
        int64_t r = order[i];
        if (inter) adam(I + r * 3 * D, I + r * 3 * D + D, I + r * 3 * D + 2 * D, g.data());
        else adam(W + r * D, M + r * D, S + r * D, g.data());
      }
    });
    for (auto& x : th) x.join();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<int64_t> sorted = rows; std::sort(sorted.begin(), sorted.end());
  for (int round = 0; round < 3; ++round) {
    for (int threads : {1, 2}) {
      double a[4];
      std::vector<double> s[4];
      for (int rep = 0; rep < 7; ++rep) {
        s[0].push_back(run(rows, false, threads)); s[1].push_back(run(sorted, false, threads));
        s[2].push_back(run(rows, true, threads)); s[3].push_back(run(sorted, true, threads));
      }
      for (int j = 0; j < 4; ++j) { std::sort(s[j].begin(), s[j].end()); a[j] = s[j][3]; }
      printf("threads %d: separate %.2f ms, separate sorted %.2f, interleaved %.2f, interleaved sorted %.2f\n",
             threads, a[0], a[1], a[2], a[3]);
    }
  }
}
