"""Op tests that each start a fresh Python: the backend chosen by the
environment or by a missing op library, and calls that once crashed the
process (a crash there fails the test instead of ending pytest)."""

import os
import signal
import subprocess
import sys

import pytest

import tfde.ops

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfde.__file__)))


def test_reference_backend_can_be_forced_by_environment():
  import subprocess
  import sys
  code = ("import tfde.ops; print(tfde.ops.current_backend())")
  env = dict(__import__("os").environ, TFDE_OPS="reference",
             TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True).stdout
  assert out.strip().splitlines()[-1] == "reference"


def test_missing_library_falls_back_with_one_warning(tmp_path):
  # A copy of the package without the .so: the twins must take over.
  import shutil
  import subprocess
  import sys

  import tfde
  src = __import__("os").path.dirname(tfde.__file__)
  shutil.copytree(src, tmp_path / "tfde",
                  ignore=shutil.ignore_patterns("*.so", "__pycache__"))
  code = ("import warnings, tensorflow as tf, tfde.ops\n"
          "with warnings.catch_warnings(record=True) as w:\n"
          "  warnings.simplefilter('always')\n"
          "  tfde.ops.unique_with_counts(tf.constant([1, 1]))\n"
          "  tfde.ops.unique_with_counts(tf.constant([2]))\n"
          "print(tfde.ops.current_backend(), len(w), w[0].message)\n")
  env = dict(__import__("os").environ, PYTHONPATH=str(tmp_path),
             TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TFDE_OPS", None)
  env.pop("TFDE_OPS_LIBRARY", None)
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True, cwd=tmp_path).stdout
  last = out.strip().splitlines()[-1]
  assert last.startswith("reference 1 "), last
  assert "does not exist" in last


# ------------------------------- calls that crashed, in a fresh process

_FRESH_PROCESS = """
import resource
import tensorflow as tf
import tfde.ops
tf.constant(0) + 1  # TensorFlow's own set-up, before any limit
if {headroom} is not None:
  status = next(l for l in open("/proc/self/status") if l.startswith("VmSize"))
  in_use = int(status.split()[1]) * 1024
  resource.setrlimit(resource.RLIMIT_AS,
                     (in_use + {headroom} * 2**30, resource.RLIM_INFINITY))
with tfde.ops.backend({backend!r}):
  for call in {calls!r}:
    try:
      result = eval(call)
      print("RESULT", tuple(result.shape) if hasattr(result, "shape") else result,
            flush=True)
    except (tf.errors.OpError, TypeError, ValueError) as e:
      message = getattr(e, "message", str(e)).strip().splitlines()[0]
      print("RAISED", type(e).__name__ + ":", message, flush=True)
"""


def _run_in_fresh_process(backend, calls, memory_headroom_gib=None):
  """Evaluates each expression of `calls` in a fresh Python on `backend`,
  so that a call that crashes fails the test instead of ending pytest.
  With `memory_headroom_gib`, the process's address space is limited to what
  TensorFlow holds plus that much, so an allocation past it fails at once
  instead of taking the machine's memory. Returns one line per call:
  "RESULT <shape>" or "RAISED <error type>: <message>"."""
  code = _FRESH_PROCESS.format(headroom=memory_headroom_gib, backend=backend, calls=calls)
  env = dict(os.environ, PYTHONPATH=_REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  if memory_headroom_gib is not None:
    # Without oneDNN's options TensorFlow's plain CPU allocator fails an
    # allocation past the limit at once; oneDNN's retries it for 10 s
    # before ResourceExhaustedError (about 20 s a test, 5 without).
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                        text=True, timeout=600, cwd=_REPO_ROOT)
  if proc.returncode < 0:
    done = sum(l.startswith(("RESULT", "RAISED")) for l in proc.stdout.splitlines())
    pytest.fail(f"the process died of {signal.Signals(-proc.returncode).name} in call "
                f"{done + 1} of {len(calls)}, {calls[done]}:\n{proc.stderr[-3000:]}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [l for l in proc.stdout.splitlines() if l.startswith(("RESULT", "RAISED"))]
  assert len(lines) == len(calls), proc.stdout
  return lines


# The calls that crashed, all evaluated in one fresh process per backend
# (each start costs about 7 s of CPU); each test reads its own lines. The
# limit leaves 4 GiB: past it an allocation fails at once.
_COMBINE_GRAD = ("tfde.ops.embedding_combine_grad(tf.ones([2, 4]), tf.constant([0, 1]), "
                 "tf.constant([0, 1, 2], tf.int64), None, 10**9)")
_PARTITION = "tfde.ops.partition_by_shard(tf.constant([1, 2], tf.int64), 2**31 - 1)"
_WIDE_ROWS = ("tfde.ops.dynamic_store(tfde.ops.DynamicTableSpec(dim=2**24), 'wide').lookup("
              "tf.constant([5], tf.int64), tf.constant([1], tf.int64), 1, insert=True)[0]")


def _other_dtype_calls(dtype):
  table = f"tf.Variable(tf.ones([4, 4], tf.{dtype}))"
  return [f"tfde.ops.gather_from_tables([{table}], tf.constant([0], tf.int64), [0])",
          f"tfde.ops.combine_from_tables([{table}], tf.constant([0], tf.int64), [0], "
          "tf.constant([0]), tf.constant([0, 1], tf.int64))",
          f"tfde.ops.sparse_apply_sgd({table}, tf.constant([0]), tf.ones([1, 4]), 0.1)"]


_CRASHED_CALLS = ([_COMBINE_GRAD, _PARTITION, _WIDE_ROWS] + _other_dtype_calls("int32") +
                  _other_dtype_calls("float64"))
_RESULTS = {}


def _results_of(backend, calls):
  """The lines of `calls` (from `_CRASHED_CALLS`) on `backend`, from the
  one fresh process that evaluates them all."""
  if backend not in _RESULTS:
    _RESULTS[backend] = dict(zip(_CRASHED_CALLS, _run_in_fresh_process(
        backend, _CRASHED_CALLS, memory_headroom_gib=4)))
  return [_RESULTS[backend][call] for call in calls]


def test_combine_grad_of_more_rows_than_memory_is_an_error(op_backend):
  """10**9 gradient rows (16 GB) past the limit: ResourceExhausted. (The
  kernel's scratch was a std::vector of num_unique entries, whose bad_alloc
  ended the process.)"""
  [line] = _results_of(op_backend, [_COMBINE_GRAD])
  assert line.startswith("RAISED ResourceExhaustedError"), line


def test_partition_into_more_shards_than_memory_is_an_error(op_backend):
  [line] = _results_of(op_backend, [_PARTITION])
  assert line.startswith("RAISED ResourceExhaustedError"), line


def test_dynamic_table_of_very_wide_rows(op_backend):
  """Rows of 2**24 floats (64 MiB): the kernel's row store allocated 4096
  rows at a time (256 GiB here) and its bad_alloc ended the process; now a
  block holds as many rows as fit 64 MiB, at least one."""
  [line] = _results_of(op_backend, [_WIDE_ROWS])
  assert line == f"RESULT (1, {2**24})"


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_tables_of_another_dtype_are_refused(op_backend, dtype):
  """A table must be a float32 matrix on both backends. (The twin of the
  gather read an int32 table as float32, and TensorFlow aborted.)"""
  for line in _results_of(op_backend, _other_dtype_calls(dtype)):
    assert line.startswith("RAISED InvalidArgumentError"), line
    assert f"must be a float32 matrix, got {dtype} [4,4]" in line, line


# ------------------------------- the bag index's parallel blocks

_BAG_INDEX_IN_BLOCKS = """
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(5)
sys.path.insert(0, {root!r})
import tfde.ops
from tests.support import oracles
assert tfde.ops.current_backend() == "kernels", tfde.ops.current_backend()
rng = np.random.default_rng(3)
# 5 * 2^16 + 13 ids in samples of uneven length: 5 blocks whose edges fall
# inside samples and rows.
n, vocab, dim = 5 * 2**16 + 13, 20_000, 4
lengths = rng.integers(1, 80, size=n)
lengths = lengths[:np.searchsorted(np.cumsum(lengths), n)]
lengths = np.append(lengths, n - lengths.sum())
splits = np.concatenate([[0], np.cumsum(lengths)])
flat = (rng.zipf(1.1, size=n) - 1) % vocab
unique, inverse = tfde.ops.sorted_unique_in_range(tf.constant(flat), vocab)
grad = rng.normal(size=(len(lengths), dim)).astype(np.float32)
bags = tfde.ops.bag_gradients(tf.constant(grad), inverse, tf.constant(splits), None,
                              tf.size(unique), "mean")
order = np.argsort(inverse.numpy(), kind="stable")
sample = np.repeat(np.arange(len(lengths)), lengths)
np.testing.assert_array_equal(bags.bags.numpy(), sample[order])
np.testing.assert_array_equal(
    bags.segments.numpy(),
    np.concatenate([[0], np.cumsum(np.bincount(inverse.numpy(), minlength=len(unique)))]))
np.testing.assert_allclose(bags.weights.numpy(), (1.0 / lengths[sample])[order], rtol=1e-6)
ids = [flat[splits[b]:splits[b + 1]] for b in range(len(lengths))]
want = oracles.combine_grad_dense(vocab, grad, ids, None, "mean")[unique.numpy()]
got = tfde.ops.embedding_combine_grad(tf.constant(grad), inverse, tf.constant(splits), None,
                                      tf.size(unique), "mean")
# float32 sums of up to tens of thousands of entries (the hottest ids)
# against float64: the rounding, not the order, sets the tolerance.
np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-3)
print("ok")
"""


@pytest.mark.skipif(tfde.ops.native.load_error() is not None,
                    reason="the blocks are the kernels'; the op library did not load")
def test_bag_index_in_five_blocks_matches_numpy():
  # Five intra-op threads: the kernels build the index in five blocks of
  # uneven edges (GroupByRowInParallel), for the optimizers' bags and the
  # combine gradient alike; each row's entries stay its ids in order.
  code = _BAG_INDEX_IN_BLOCKS.format(root=_REPO_ROOT)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TFDE_OPS", None)
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, cwd=_REPO_ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == "ok"
