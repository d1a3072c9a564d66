"""tf.estimator over tfde tables (TensorFlow 2.15 with tensorflow-estimator;
skipped where tf.estimator is gone), against the numpy oracle
(tests/support/estimator_model.py)."""

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("tensorflow_estimator")

import tfde  # noqa: E402
from tests.support import estimator_model as m  # noqa: E402

STEPS = 4


def _estimator(model_dir):
  config = tf.estimator.RunConfig(model_dir=str(model_dir), tf_random_seed=1,
                                  save_summary_steps=None, log_step_count_steps=None,
                                  save_checkpoints_steps=1000)
  return tf.estimator.Estimator(m.model_fn, config=config)


def _oracle(steps):
  oracle = m.Oracle()
  for step in range(steps):
    oracle.train(step)
  return oracle


def test_train_and_evaluate_predict_and_export_equal_the_oracle(tmp_path):
  """K steps of train_and_evaluate: the tables trained by their own sparse
  optimizers (the dense Adagrad makes slots for `w` only) and `w` by the
  dense one equal the oracle; evaluate and predict score as it does; the
  export serves in an interpreter where tfde cannot be imported."""
  est = _estimator(tmp_path / "run")
  tf.estimator.train_and_evaluate(
      est, tf.estimator.TrainSpec(m.input_fn(0, STEPS), max_steps=STEPS),
      tf.estimator.EvalSpec(m.input_fn(STEPS, 1), steps=1, throttle_secs=0))
  oracle = _oracle(STEPS)
  m.assert_tables_equal_oracle(m.checkpoint_tables(est.model_dir), oracle, STEPS)
  np.testing.assert_allclose(est.get_variable_value("w"), oracle.w, rtol=1e-5, atol=1e-6)
  names = est.get_variable_names()
  # The dense optimizer's slots: for w and the (zero-gradient) trigger only.
  assert [n for n in names if n.endswith("/Adagrad")] == [
      "sparse_update_trigger/Adagrad", "w/Adagrad"], names

  metrics = est.evaluate(m.input_fn(STEPS, 1), steps=1)
  assert metrics["global_step"] == STEPS
  np.testing.assert_allclose(metrics["loss"], oracle.loss(m.batch(STEPS)), rtol=1e-5)

  probe = m.batch(STEPS + 1)
  scores = [p["score"] for p in est.predict(m.input_fn(STEPS + 1, 1))]
  np.testing.assert_allclose(scores, oracle.scores(probe["user"]), rtol=1e-5, atol=1e-6)

  def serving_input():
    user = tf.compat.v1.placeholder(tf.int64, [None, 2], name="user")
    return tf.estimator.export.ServingInputReceiver({"user": user}, {"user": user})

  export = est.export_saved_model(str(tmp_path / "export"), serving_input)
  script = textwrap.dedent(f"""
      import sys
      sys.modules["tfde"] = None  # tfde cannot be imported here
      import numpy as np, tensorflow as tf
      served = tf.saved_model.load({export.decode()!r})
      out = served.signatures["serving_default"](
          user=tf.constant(np.array({probe["user"].tolist()}, np.int64)))
      print("SCORES", out["score"].numpy().tolist())
      """)
  result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path),
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 0, result.stderr[-3000:]
  served = eval(result.stdout.split("SCORES", 1)[1])  # pylint: disable=eval-used
  np.testing.assert_allclose(served, oracle.scores(probe["user"]), rtol=1e-5, atol=1e-6)


def test_stopped_and_restarted_training_continues_to_the_same_tables(tmp_path):
  """train(2) then a fresh Estimator's train(2) from the model_dir equals 4
  unstopped oracle steps: rows, Adagrad accumulators, lazy Adam slots,
  sighting counts, pending ids and eviction ages all come back."""
  _estimator(tmp_path).train(m.input_fn(0, 2), steps=2)
  _estimator(tmp_path).train(m.input_fn(2, STEPS - 2), steps=STEPS - 2)
  oracle = _oracle(STEPS)
  m.assert_tables_equal_oracle(m.checkpoint_tables(str(tmp_path)), oracle, STEPS)
  # Eviction happened across the restart (ids unseen for 3 steps are gone).
  assert oracle.item.rows or oracle.item.pending


# ---- Horovod: the same model_fn on 2 ranks (tests/workers/estimator_hvd_worker.py) ----

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")


def _horovodrun(root, first_step, steps, ranks=2):
  """The worker on `ranks` Horovod ranks (Gloo), this interpreter's
  environment; skips where Horovod is not installed in it, or fails when
  TFDE_REQUIRE_HOROVOD=1."""
  probe = subprocess.run([sys.executable, "-c", "import horovod.tensorflow"],
                         capture_output=True, text=True)
  if not os.path.exists(HOROVODRUN) or probe.returncode:
    why = f"no Horovod in {sys.prefix}: {probe.stderr[-300:]}"
    if os.environ.get("TFDE_REQUIRE_HOROVOD") == "1":
      pytest.fail(why)
    pytest.skip(why + " (make tf215-env)")
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2",
             PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
  result = subprocess.run(
      [HOROVODRUN, "-np", str(ranks), "--gloo", "-H", f"localhost:{ranks}",
       sys.executable, "-m", "tests.workers.estimator_hvd_worker", "--root", str(root),
       "--first-step", str(first_step), "--steps", str(steps)],
      capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
  # The ranks' own errors, not only the launcher's traceback that ends it.
  errors = [line for line in (result.stdout + result.stderr).splitlines()
            if "Error" in line or "error:" in line]
  assert result.returncode == 0, "\n".join(errors[-30:]) + result.stderr[-2000:]
  for rank in range(ranks):
    assert f"rank {rank} of {ranks}: trained" in result.stdout


def _assert_checkpoint_equals_oracle(model_dir, steps):
  oracle = _oracle(steps)
  m.assert_tables_equal_oracle(m.checkpoint_tables(str(model_dir)), oracle, steps)
  reader = tf.train.load_checkpoint(str(model_dir))
  np.testing.assert_allclose(reader.get_tensor("w"), oracle.w, rtol=1e-5, atol=1e-6)
  assert reader.get_tensor("global_step") == steps


@pytest.mark.timeout(900)
def test_two_horovod_ranks_equal_the_single_process_run(tmp_path):
  """The model_fn on 2 ranks, each on half of every global batch, with
  BroadcastGlobalVariablesHook: after K steps every rank's checkpoint holds
  the tables, their slots and counters, `w` and the step of the oracle's
  single-process run of the same global batches."""
  _horovodrun(tmp_path, 0, STEPS)
  for rank in range(2):
    _assert_checkpoint_equals_oracle(tmp_path / f"rank_{rank}", STEPS)


def _whole_table_model_fn(features, labels, mode, params):
  """m.model_fn with the whole-table saver (tfde.tables.graph_saving.saver):
  a single process restores a checkpoint of any rank count with it."""
  spec = m.model_fn(features, labels, mode, params)
  return spec._replace(scaffold=tf.compat.v1.train.Scaffold(
      saver=tfde.tables.graph_saving.saver()))


@pytest.mark.timeout(900)
def test_checkpoints_move_between_one_process_and_two_ranks(tmp_path):
  """2 ranks train 2 steps; one process restores rank 0's checkpoint and
  trains 2 more: the oracle's 4 steps. And back: one process trains 2
  steps, 2 ranks restore its checkpoint and train 2 more: the same."""
  _horovodrun(tmp_path / "ranks", 0, 2)
  single = tmp_path / "single"
  shutil.copytree(tmp_path / "ranks" / "rank_0", single)
  config = tf.estimator.RunConfig(model_dir=str(single), tf_random_seed=1,
                                  save_summary_steps=None, log_step_count_steps=None,
                                  save_checkpoints_steps=1000)
  tf.estimator.Estimator(_whole_table_model_fn, config=config).train(
      m.input_fn(2, STEPS - 2), steps=STEPS - 2)
  _assert_checkpoint_equals_oracle(single, STEPS)

  _estimator(tmp_path / "first").train(m.input_fn(0, 2), steps=2)
  for rank in range(2):
    shutil.copytree(tmp_path / "first", tmp_path / "back" / f"rank_{rank}")
  _horovodrun(tmp_path / "back", 2, STEPS - 2)
  for rank in range(2):
    _assert_checkpoint_equals_oracle(tmp_path / "back" / f"rank_{rank}", STEPS)
