"""Test set-up: quiet TensorFlow, four logical CPU devices for
MirroredStrategy, and a fixture running a test on both op backends."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)

# Two logical GPUs on the first GPU, so that MirroredStrategy's
# sharded path runs on a one-GPU machine too (tests/unit/test_gpu.py). The tests'
# tables are small; the limit leaves room for several test processes.
_gpus = tf.config.list_physical_devices("GPU")
if _gpus:
  tf.config.set_logical_device_configuration(
      _gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=4096)] * 2)

import tfde.ops  # noqa: E402


def pytest_report_header(config):
  state = ("loaded" if tfde.ops.kernels_available()
           else f"UNAVAILABLE ({tfde.ops.native.load_error()})")
  return f"tfde op library: {state}; TensorFlow {tf.__version__}"


@pytest.fixture(params=[tfde.ops.KERNELS, tfde.ops.REFERENCE])
def op_backend(request):
  """Runs the test once on the C++ kernels and once on the pure-TF twins.

  The kernel run fails (not skips) when the library is missing, unless
  TFDE_OPS=reference asks for twins only.
  """
  if (request.param == tfde.ops.KERNELS and
      os.environ.get("TFDE_OPS") == tfde.ops.REFERENCE):
    pytest.skip("TFDE_OPS=reference")
  with tfde.ops.backend(request.param):
    yield request.param
