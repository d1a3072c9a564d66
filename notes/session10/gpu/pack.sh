#!/bin/bash
# Here: cuts what the lent GPU machine needs into pieces of at most 64 MiB
# under the ignored .devstage/ (one piece per `device` call, moved aside
# there by ../../session9/gpu/stage.sh). Inputs, made once (session 9's
# README beside run.sh): /tmp/tf312.tar.xz (TensorFlow 2.21.0's CUDA
# wheel for cp312, unpacked, headers dropped, xz -9), the wheels in
# /tmp/gpuwheels, CUPTI 12 in /tmp/cupti, and the GPU op library built
# in $GPU_BUILD (default /tmp/gpubuild) with TFDE_CUDA_ARCHS=90.
set -eu
cd "$(git rev-parse --show-toplevel)"
GPU_BUILD=${GPU_BUILD:-/tmp/gpubuild}
rm -rf .devstage && mkdir -p .devstage/p0/wheels .devstage/p0/cudart .devstage/p5/cupti
MiB=$((1024 * 1024))
# p0: the first 28 MiB of TensorFlow with the wheels and the op library.
head -c $((28 * MiB)) /tmp/tf312.tar.xz > .devstage/p0/tf.tar.xz.00
for k in 1 2 3 4; do
  mkdir -p .devstage/p$k
  tail -c +$(( (28 + 60 * (k - 1)) * MiB + 1 )) /tmp/tf312.tar.xz | head -c $((60 * MiB)) \
    > .devstage/p$k/tf.tar.xz.0$k
done
tail -c +$(( (28 + 240) * MiB + 1 )) /tmp/tf312.tar.xz > .devstage/p5/tf.tar.xz.05
cp /tmp/gpuwheels/*.whl .devstage/p0/wheels/
mv .devstage/p0/wheels/nvidia_cuda_runtime_cu12-*.whl .devstage/p0/cudart/
cp /tmp/cupti/*.whl .devstage/p5/cupti/
cp "$GPU_BUILD/tfde/ops/_tfde_ops.so" "$GPU_BUILD/tfde/_build_info.py" .devstage/p0/
cat .devstage/p*/tf.tar.xz.* | cmp - /tmp/tf312.tar.xz && echo "pieces join to the archive"
du -sh .devstage/p*
