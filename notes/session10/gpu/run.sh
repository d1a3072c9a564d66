#!/bin/bash
# On the lent GPU machine (no TensorFlow there, nothing to download): puts
# together TensorFlow 2.21 (its CUDA 12.5 build, carried in pieces by
# stage.sh) and runs tfde's GPU checks inside it. See ../../session9/gpu/README.md.
#   bash notes/session10/gpu/run.sh [tests|profile|bench|tests+bench|all]  (TESTS=... picks the test files)
set -u
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=/tmp/stage; SITE=/tmp/site; SHIM=/tmp/cu12
T0=$(date +%s)
if [ ! -e $SITE/tensorflow/__init__.py ]; then
  mkdir -p $SITE
  ls $S/p*/tf.tar.xz.* | tr '\n' ' '; echo
  unxz() { if command -v xz >/dev/null; then xz -d -T0; else python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)"; fi; }
  cat $S/p*/tf.tar.xz.* | unxz | tar x -C $SITE || { echo "unpacking TF failed"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE $S/p0/wheels/*.whl || exit 1
  mkdir -p /tmp/cudart12 && (cd /tmp/cudart12 && python3 -m zipfile -e $S/p0/cudart/*.whl .)
fi
# CUPTI 12, for tf.profiler's GPU events (bench/gpu_bench.py --profile).
if ls $S/p5/cupti/*.whl >/dev/null 2>&1 && [ ! -d /tmp/cupti12 ]; then
  mkdir -p /tmp/cupti12 && (cd /tmp/cupti12 && python3 -m zipfile -e $S/p5/cupti/*.whl .)
fi
cp -f $S/p0/_tfde_ops.so tfde/ops/_tfde_ops.so && cp -f $S/p0/_build_info.py tfde/_build_info.py
# The sonames TensorFlow dlopens before it registers a GPU: the real CUDA 12
# runtime, and for the rest the image's CUDA 13 libraries under CUDA 12
# names (tfde's path calls none of them; a matmul would).
mkdir -p $SHIM && cp -f /tmp/cudart12/nvidia/cuda_runtime/lib/libcudart.so.12 $SHIM/
dirs=""
for pair in libcublas.so.12:libcublas.so.13 libcublasLt.so.12:libcublasLt.so.13 \
            libcufft.so.11:libcufft.so.12 libcusolver.so.11:libcusolver.so.12 \
            libcusparse.so.12:libcusparse.so.12 libcudnn.so.9:libcudnn.so.9; do
  want=${pair%%:*}; have=${pair##*:}
  path=$(find /opt /usr/local /usr/lib -name "$have" 2>/dev/null | head -1)
  echo "$want -> ${path:-MISSING}"
  [ -n "$path" ] && ln -sf "$path" $SHIM/$want && dirs="$dirs:$(dirname $path)"
done
export LD_LIBRARY_PATH=$SHIM$dirs:/tmp/cupti12/nvidia/cuda_cupti/lib:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$SITE:$PWD TF_FORCE_GPU_ALLOW_GROWTH=true PYTHONUNBUFFERED=1
echo "set up in $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
TF_CPP_MIN_LOG_LEVEL=0 python3 - <<'PY' 2>&1 | grep -v "^WARNING" | tail -25
import tensorflow as tf, tfde.ops
print("TF", tf.__version__, "GPUs:", tf.config.list_physical_devices("GPU"))
print("tfde ops:", tfde.ops.kernels_available(), tfde.ops.native.load_error())
with tf.device("/GPU:0"):
  u = tfde.ops.unique_with_counts(tf.constant([3, 1, 3, 7], tf.int64))
print("unique on", u[0].device, [x.numpy().tolist() for x in u])
PY
if [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = tests+bench ]; then
  T1=$(date +%s)
  TESTS=${TESTS:-"tests/test_gpu.py tests/test_cuda_kernels.py tests/test_ops.py tests/test_ops_optimizers.py tests/test_sharded.py tests/test_forward_dedup.py"}
  timeout 150 python3 -m pytest -q -rfs -p no:cacheprovider -n 6 $TESTS \
    2>&1 | tee $OUT/tests.log | grep -v "^WARNING\|^I0000\|^E0000\|^W0000" | tail -40
  echo "tests took $(( $(date +%s) - T1 )) s"
fi
if [ "$what" = profile ] || [ "$what" = all ]; then
  T1=$(date +%s)
  timeout 170 python3 bench/gpu_bench.py --profile --reps 20 2>&1 | tee $OUT/profile.log | grep -v "^WARNING\|^I0000\|^W0000" | tail -120
  echo "profile took $(( $(date +%s) - T1 )) s"
fi
if [ "$what" = bench ] || [ "$what" = all ] || [ "$what" = tests+bench ]; then
  T1=$(date +%s)
  timeout 120 python3 bench/gpu_bench.py --reps 20 2>&1 | tee $OUT/bench.log | grep -v "^WARNING\|^I0000\|^W0000" | tail -45
  echo "bench took $(( $(date +%s) - T1 )) s"
fi
