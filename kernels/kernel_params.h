// Plain parameter types shared by the CPU kernels and the CUDA launchers
// (kernels/cuda/embedding_kernels.cu.h): no TensorFlow and no CUDA here, so
// both sides compile it and derive the optimizers' constants one way.
#ifndef TFDE_KERNELS_KERNEL_PARAMS_H_
#define TFDE_KERNELS_KERNEL_PARAMS_H_

#include <cmath>

namespace tfde {

enum class Combiner : int { kSum = 0, kMean = 1, kSqrtn = 2 };

struct SgdParams { float lr; };
struct AdagradParams { float lr, epsilon; };
struct LazyAdamParams { float beta_1, beta_2, epsilon, alpha; };
struct FtrlParams { float lr, l1, l2_shrinkage, lr_power, l2_total; };

// Bias correction in float, as Keras computes it; step is 1-based.
inline LazyAdamParams MakeLazyAdamParams(float lr, float beta_1, float beta_2,
                                         float epsilon, float step) {
  const float alpha = lr * std::sqrt(1.0f - std::pow(beta_2, step)) /
                      (1.0f - std::pow(beta_1, step));
  return LazyAdamParams{beta_1, beta_2, epsilon, alpha};
}

inline FtrlParams MakeFtrlParams(float lr, float l1, float l2, float l2_shrinkage,
                                 float beta, float learning_rate_power) {
  return FtrlParams{lr, l1, l2_shrinkage, learning_rate_power, l2 + beta / (2.0f * lr)};
}

}  // namespace tfde

#endif  // TFDE_KERNELS_KERNEL_PARAMS_H_
