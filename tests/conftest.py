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


# The slowest files first, so that pytest-xdist's two workers (each taking
# whole files, `--dist loadfile --no-loadscope-reorder`) end together: by
# default it queues files by their number of tests, which left a few slow
# files with few tests (the multi-process ones) for the end. Seconds of one
# run on a loaded 2-core host, in that order: 519, 416, 361, 234, 177, 157,
# 141, 136, 115, 101, 95, 82; the rest keep their order.
SLOWEST_FIRST = (
    "tests/unit/test_sharded.py", "tests/distributed/test_multiprocess.py",
    "tests/unit/test_sharding_kinds.py", "tests/distributed/test_horovod_plans.py",
    "tests/unit/test_row_features.py", "tests/unit/test_cli.py",
    "tests/unit/test_ops_fresh_process.py", "tests/unit/test_crash_safe_saves.py",
    "tests/distributed/test_multiprocess_reliability.py", "tests/unit/test_layers.py",
    "tests/unit/test_serving.py", "tests/unit/test_dynamic_tables.py")


def pytest_collection_modifyitems(session, config, items):
  del session, config
  rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
