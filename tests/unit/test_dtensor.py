"""tfde.dtensor: tables on a DTensor mesh of logical CPUs, held to the
numpy reference of the unsharded model; the per-shard layout each device
holds; checkpoints to and from tfde.layers.DistributedEmbedding.

Training runs in a child process (tests/workers/dtensor_worker.py): DTensor's
device is process-wide. `TFDE_DTENSOR_FULL=1` (make dtensor-test) runs
every optimizer on every mesh size."""

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings

import pytest

needs_tf_keras = pytest.mark.skipif(
    importlib.util.find_spec("tf_keras") is None,
    reason="tfde.dtensor needs tf_keras (pip install tfde[dtensor])")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad")


def cases():
  if os.environ.get("TFDE_DTENSOR_FULL"):
    return ([f"{n}:{k}:{i}" for n in (1, 2, 4) for i, k in enumerate(OPTIMIZERS)] +
            [f"2x2:{k}:{i}" for i, k in enumerate(OPTIMIZERS)])
  # Each optimizer once, each mesh size, and (the three tables' combiners
  # rotate with the variant) every combiner on every mesh size; then a
  # "batch" x "model" mesh, the tables sharded over "batch" only.
  return ["1:sgd:0", "2:adagrad:1", "4:ftrl:2", "4:adam:0", "2x2:adam:1",
          "2:rowwise_adagrad:2"]


def run_worker(module, *args, timeout=600):
  result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
  assert result.returncode == 0, result.stderr[-4000:]
  return [json.loads(line) for line in result.stdout.splitlines()
          if line.startswith("{")]


@pytest.fixture(scope="module")
def worker_reports(tmp_path_factory):
  """One child process for every test below (each start costs seconds):
  the layout, checkpoint and tutorial reports, then one per training case."""
  return run_worker("tests.workers.dtensor_worker", "layout-and-checkpoint",
                    str(tmp_path_factory.mktemp("dtensor")), *cases())


@pytest.fixture(scope="module")
def layout_and_checkpoint(worker_reports):
  return worker_reports[:3]


@needs_tf_keras
def test_training_equals_the_unsharded_numpy_reference(worker_reports):
  results = worker_reports[3:]
  assert len(results) == len(cases())
  for r in results:
    assert r["output_error"] < 2e-5, r
    assert r["table_error"] < 2e-5, r
    assert set(r["steps"].values()) == {3}, r
    # Outputs stay sharded on the batch dimension.
    assert r["output_layouts"] == [["batch", "unsharded"]], r
    # The updates leave each shard in place for the next forward's read
    # (no copy of V / N rows per step).
    assert r["reads_share_shards"], r
    assert r["shard_copies_agree"], r
    assert r["held_reads_kept"], r


@needs_tf_keras
def test_each_device_holds_its_own_shard_and_bad_ids_are_refused(layout_and_checkpoint):
  report = layout_and_checkpoint[0]
  for name, vocabulary, rows, dim in (("A", 37, 10, 4), ("B", 50, 13, 4), ("C", 23, 6, 3)):
    table = report[name]
    assert table["vocabulary"] == vocabulary
    # Table and both FTRL slots: one [ceil(V/4), D] component per device,
    # on devices 0..3, never the whole table.
    assert table["shapes"] == [[rows, dim]] * 12
    assert table["devices"] == ["0", "1", "2", "3"] * 3
    # Device s holds global rows s, s+4, ... (numpy's full[s::4]).
    assert table["max_error"] == 0.0
    assert table["layout"] == ["batch", "unsharded"]
  # Each refused call runs once (three of each kind). On DTensor's
  # asynchronous device a call may end in another device's CancelledError
  # instead of the named error (docs/doors/dtensor.md says when): counted,
  # and each kind must still name the feature at least once.
  named = 0
  for key, words in (("bad_id_error", ["feature b_sparse (table B)", "[0, 50)"]),
                     ("uint64_error", ["feature b_sparse (table B)",
                                       "uint64 id of 2^63 or more"])):
    errors = [e for e in report[key] if not e.startswith("CancelledError: ")]
    assert all(report[key]) and errors, (key, report[key])
    named += len(errors)
    for error in errors:
      for word in words:
        assert word in error, (key, error)
  assert named + report["cancelled_calls"] == 6, report
  if report["cancelled_calls"]:
    warnings.warn(f"{report['cancelled_calls']} of 6 refused DTensor calls ended in "
                  "a CancelledError (asynchronous DTensor device)", stacklevel=1)
  assert report["unchanged"]
  assert report["uint64_rows_equal"]


@needs_tf_keras
def test_the_tutorial_step_is_refused_by_name_and_tfde_step_trains(layout_and_checkpoint):
  """Handing every trainable variable's gradient to a Keras optimizer trains
  no tfde table: refused on the first step (traced or eager), naming what
  to call; tfde's own step, the optimizer given the layer's variables too,
  equals the numpy reference."""
  report = layout_and_checkpoint[2]
  for mode in ("traced", "eager"):
    error = report[f"tutorial_{mode}_error"]
    assert error, mode
    for word in ("gradient_sources()", "sparse_gradients", "apply_gradients"):
      assert word in error, (mode, error)
  assert report["tutorial_unchanged"]
  assert report["tfde_step_moved"] > 1e-3
  assert report["tfde_step_table_error"] < 2e-5, report


@needs_tf_keras
def test_checkpoints_to_and_from_the_keras_layer_under_mirrored_strategy(
    layout_and_checkpoint):
  errors = layout_and_checkpoint[1]
  for name in ("A", "B", "C"):
    assert errors[f"{name}/to_mirrored"] == 0.0
    assert errors[f"{name}/back"] == 0.0
    assert errors[f"{name}/step"] == 2 + 5
  # A checkpoint with a table of another shape: refused by name, and no
  # table of the mesh's layer changed.
  assert "table 'B'" in errors["bad_restore_error"], errors["bad_restore_error"]
  assert errors["bad_restore_unchanged"]


@needs_tf_keras
def test_the_dtensor_ranking_example_trains():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "examples", "dtensor_ranking.py"),
       "--epochs", "2", "--rows", "6000", "--steps", "8"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  rmse = [float(re.match(r"[0-9.]+", part).group())
          for part in result.stdout.split("rmse: ")[1:]]
  # The progress bar's running RMSE falls as the tables and head train.
  assert rmse and rmse[-1] < rmse[0], result.stdout[-2000:]
  test_rmse = float(result.stdout.split("test RMSE ")[1].split()[0])
  assert 0.0 < test_rmse < rmse[0]


@needs_tf_keras
def test_a_nonfinite_gradient_is_refused_naming_the_table(layout_and_checkpoint):
  errors = layout_and_checkpoint[1]
  assert "table A: the gradient of step 3 holds NaN or Inf" in errors["nonfinite_error"]
  assert errors["nonfinite_unchanged"]


def test_import_tfde_needs_no_tf_keras_and_tfde_dtensor_says_what_to_install(monkeypatch):
  import tfde  # noqa: F401  (imports nothing of tf_keras)
  monkeypatch.setitem(sys.modules, "tf_keras", None)  # as if not installed
  monkeypatch.delitem(sys.modules, "tfde.dtensor", raising=False)
  with pytest.raises(ImportError, match=r"pip install tfde\[dtensor\]"):
    importlib.import_module("tfde.dtensor")
