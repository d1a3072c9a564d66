#include <immintrin.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
constexpr int T = 4, V = 1000000, D = 64, B = 4096, H = 20;
float* tables;
std::vector<int64_t> rows;  // fused rows, T*B*H
std::vector<int64_t> splits;
float* out;
template <int PD>
void variant_mem(int64_t b0, int64_t b1) {
  float acc[D];
  const int64_t last = splits[b1];
  for (int64_t b = b0; b < b1; ++b) {
    std::fill(acc, acc + D, 0.f);
    for (int64_t i = splits[b]; i < splits[b + 1]; ++i) {
      if (i + PD < last) { const char* p = (const char*)(tables + rows[i + PD] * D); for (int c = 0; c < 256; c += 64) __builtin_prefetch(p + c, 0, 3); }
      const float* r = tables + rows[i] * D;
      for (int d = 0; d < D; ++d) acc[d] += 1.0f * r[d];
    }
    std::copy(acc, acc + D, out + b * D);
  }
}
template <int PD, int HINT>
void variant_reg(int64_t b0, int64_t b1) {
  const int64_t last = splits[b1];
  for (int64_t b = b0; b < b1; ++b) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t i = splits[b]; i < splits[b + 1]; ++i) {
      if (i + PD < last) { const char* p = (const char*)(tables + rows[i + PD] * D);
        _mm_prefetch(p, (_mm_hint)HINT); _mm_prefetch(p + 64, (_mm_hint)HINT); _mm_prefetch(p + 128, (_mm_hint)HINT); _mm_prefetch(p + 192, (_mm_hint)HINT); }
      const float* r = tables + rows[i] * D;
      const __m256 w = _mm256_set1_ps(1.0f);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(w, _mm256_loadu_ps(r)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(w, _mm256_loadu_ps(r + 8)));
      a2 = _mm256_add_ps(a2, _mm256_mul_ps(w, _mm256_loadu_ps(r + 16)));
      a3 = _mm256_add_ps(a3, _mm256_mul_ps(w, _mm256_loadu_ps(r + 24)));
      a4 = _mm256_add_ps(a4, _mm256_mul_ps(w, _mm256_loadu_ps(r + 32)));
      a5 = _mm256_add_ps(a5, _mm256_mul_ps(w, _mm256_loadu_ps(r + 40)));
      a6 = _mm256_add_ps(a6, _mm256_mul_ps(w, _mm256_loadu_ps(r + 48)));
      a7 = _mm256_add_ps(a7, _mm256_mul_ps(w, _mm256_loadu_ps(r + 56)));
    }
    float* o = out + b * D;
    _mm256_storeu_ps(o, a0); _mm256_storeu_ps(o + 8, a1); _mm256_storeu_ps(o + 16, a2); _mm256_storeu_ps(o + 24, a3);
    _mm256_storeu_ps(o + 32, a4); _mm256_storeu_ps(o + 40, a5); _mm256_storeu_ps(o + 48, a6); _mm256_storeu_ps(o + 56, a7);
  }
}
template <void (*F)(int64_t, int64_t)>
double run(int threads) {
  std::vector<double> ts;
  for (int rep = 0; rep < 30; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    const int64_t nb = T * B;
    std::vector<std::thread> th;
    for (int k = 0; k < threads; ++k) th.emplace_back([=] { F(nb * k / threads, nb * (k + 1) / threads); });
    for (auto& x : th) x.join();
    ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
int main(int argc, char** argv) {
  size_t bytes = size_t(T) * V * D * 4;
  tables = (float*)aligned_alloc(1 << 21, bytes);
  if (argc > 1) madvise(tables, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < size_t(T) * V * D; ++i) tables[i] = (i % 97) * 0.01f;
  std::vector<int64_t> ids(T * B * H);
  FILE* f = fopen("/tmp/s11/ids.bin", "rb"); fread(ids.data(), 8, ids.size(), f); fclose(f);
  rows.resize(ids.size());
  for (int t = 0; t < T; ++t) for (int i = 0; i < B * H; ++i) rows[t * B * H + i] = ids[t * B * H + i] + int64_t(t) * V;
  splits.resize(T * B + 1); for (int b = 0; b <= T * B; ++b) splits[b] = int64_t(b) * H;
  out = (float*)aligned_alloc(64, size_t(T) * B * D * 4);
  for (int th : {1, 2}) {
    printf("threads %d: mem16 %.2f | reg4 %.2f reg8 %.2f reg16 %.2f reg32 %.2f | reg16 nta %.2f reg8 t1 %.2f | mem16 again %.2f\n", th,
           run<variant_mem<16>>(th), run<variant_reg<4, _MM_HINT_T0>>(th), run<variant_reg<8, _MM_HINT_T0>>(th),
           run<variant_reg<16, _MM_HINT_T0>>(th), run<variant_reg<32, _MM_HINT_T0>>(th),
           run<variant_reg<16, _MM_HINT_NTA>>(th), run<variant_reg<8, _MM_HINT_T1>>(th), run<variant_mem<16>>(th));
  }
}
