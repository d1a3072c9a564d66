"""Real multi-process training: 2 workers under MultiWorkerMirroredStrategy
(TF_CONFIG on 127.0.0.1) and 2 ranks under `horovodrun -np 2 --gloo`,
each matching the single-process numpy reference.

Horovod 0.28.1 builds only against TensorFlow 2.18 on CPU, so its ranks
run in the second environment `.venv-hvd` (TF 2.18.1) that `make test`
builds, with this checkout's tfde on PYTHONPATH and the op library built
against that TensorFlow (`build/ops/hvd`, tools/envs.py);
TFDE_REQUIRE_HOROVOD=1 (set by `make test`) turns a missing environment
into a failure instead of a skip.
"""

import functools
import json
import os
import pickle
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import dynamic_harness
from tests.support import oracles
from tests.support import sharded_harness as h
from tests.support import zygote

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HVD_VENV = os.environ.get("TFDE_HOROVOD_VENV", os.path.join(REPO, ".venv-hvd"))
HVD_OPS = os.environ.get("TFDE_HOROVOD_OPS_LIBRARY",
                         os.path.join(REPO, "build", "ops", "hvd", "_tfde_ops.so"))
TIMEOUT_S = 240
NUM_WORKERS = 2
STEPS = 10
DYNAMIC_STEPS = 6


def _free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def _worker_group(args):
  """Commands and environments for NUM_WORKERS MultiWorkerMirroredStrategy
  workers on 127.0.0.1 running `python ARGS`."""
  ports = _free_ports(NUM_WORKERS)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  commands, envs = [], []
  for index in range(NUM_WORKERS):
    envs.append(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO,
                     TF_CONFIG=json.dumps({"cluster": cluster, "task": {
                         "type": "worker", "index": index}})))
    commands.append([sys.executable] + list(args))
  return commands, envs


def _mwms_commands(tmp_path, optimizer, batches_path, extra=()):
  return _worker_group(["-m", "tests.workers.multiprocess_worker", "--mode", "mwms",
                        "--optimizer", optimizer, "--batches", batches_path,
                        "--out", str(tmp_path)] + list(extra))


def horovod_env():
  """The environment of a Horovod rank: this checkout's tfde and tests on
  the op library compiled against the Horovod environment's TensorFlow."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO,
             TFDE_OPS_LIBRARY=HVD_OPS,
             PATH=os.path.join(HVD_VENV, "bin") + os.pathsep + os.environ["PATH"])
  env.pop("TFDE_OPS", None)
  return env


def launch(commands, envs, cwd):
  """Starts processes, each in a process group of its own: this Python's
  `-m` workers forked from the fork servers (tests/support/zygote.py, the
  imports paid once; worker i from `zygote.for_worker(i)`), anything else
  (horovodrun) afresh."""
  return [zygote.for_worker(i).popen(cmd, env, cwd)
          for i, (cmd, env) in enumerate(zip(commands, envs))]


def horovodrun_command(ranks, module_args, env=None):
  """(command, environment) of a `horovodrun` job of `ranks` ranks (Gloo,
  this host) running `python -m MODULE_ARGS` in the Horovod environment
  (`env`, `horovod_env()` by default): each rank forked by a fork server
  of that environment (tests/support/zygote.py), which horovodrun
  launches, signals and waits for as it would the rank itself."""
  env = dict(env or horovod_env())
  python = os.path.join(HVD_VENV, "bin", "python")
  env[zygote.SOCKET_VARIABLE] = zygote.socket_paths(python, horovod_env(), horovod=True)
  command = [os.path.join(HVD_VENV, "bin", "horovodrun"), "-np", str(ranks),
             "--gloo", "-H", f"localhost:{ranks}", python, "-m", "tests.support.zygote"]
  return command + list(module_args), env


def _run_group(commands, envs, cwd):
  """Starts processes (`launch`); kills them all on timeout."""
  procs = launch(commands, envs, cwd)
  outputs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=TIMEOUT_S)
      outputs.append(out)
  except subprocess.TimeoutExpired:
    outputs.append("TIMEOUT")
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  return procs, outputs


def _write_batches(out_dir, optimizer):
  """The training data, made here and read by the workers: numpy versions
  differ between the two environments and so do some of their random
  streams (Generator.zipf in numpy 2.0 and 2.4)."""
  variant = h.variant_of(optimizer)
  batches = [h.make_batch(s, weighted=True, seed=variant,
                          num_replicas=NUM_WORKERS) for s in range(STEPS)]
  path = os.path.join(out_dir, "batches.pkl")
  with open(path, "wb") as f:
    pickle.dump(batches, f)
  return path, batches


def _check_against_reference(out_dir, optimizer, batches,
                             expect_backend="kernels", whole_tables=False, beside=False):
  """The workers' first outputs and final tables against the numpy
  reference run from their initial tables: row-wise shards, or with
  `whole_tables` (a plan's run) the whole tables every worker gathered."""
  variant = h.variant_of(optimizer)
  configs = h.feature_configs(optimizer, variant)
  results = [np.load(os.path.join(out_dir, f"worker_{r}.npz"))
             for r in range(NUM_WORKERS)]
  for r in results:
    assert str(r["backend"]) == expect_backend, str(r["backend"])
    assert int(r["bytes_sent"]) > 0
  if whole_tables:
    for key in results[0].files:
      if key.startswith(("initial/", "final/")):
        np.testing.assert_array_equal(results[1][key], results[0][key], err_msg=key)
    initial = {n: results[0][f"initial/{n}"] for n in h.TABLES}
    final = {n: results[0][f"final/{n}"] for n in h.TABLES}
  else:
    initial = {n: tfde.sharding.unshard_table(
        [r[f"initial/{n}"] for r in results], h.TABLES[n][0]) for n in h.TABLES}
    final = {n: tfde.sharding.unshard_table(
        [r[f"final/{n}"] for r in results], h.TABLES[n][0]) for n in h.TABLES}
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    got = np.concatenate([r[f"output/{f}"] for r in results])
    np.testing.assert_allclose(got, want_outputs[f], rtol=1e-5, atol=1e-6)
  for n in h.TABLES:
    np.testing.assert_allclose(final[n], want_tables[n], rtol=1e-5, atol=1e-6,
                               err_msg=f"table {n}")
    assert not np.allclose(final[n], initial[n])
    # A second lookup trained beside it (--beside-row-wise), from the same
    # initial tables (a function of seed and row only), on the same data.
    for r in results if beside else []:
      np.testing.assert_allclose(r[f"beside_final/{n}"], want_tables[n], rtol=1e-5,
                                 atol=1e-6, err_msg=f"beside: table {n}")


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("layouts,optimizer", [("mixed", "adam"), ("column_wise", "ftrl"),
                                               ("table_row_wise", "adagrad")])
def test_multi_worker_mirrored_two_processes_under_a_plan(tmp_path, layouts, optimizer):
  """The planner's kinds across 2 worker processes: "mixed" lays A out
  replicated, B table-wise on worker 1 and C in three 1-wide column slices
  (Adam's bias correction per slice); "column_wise" slices A and C over
  both workers (FTRL's per-element state per slice); "table_row_wise"
  spreads C's rows over both workers (and A's over worker 1 alone), fused
  with B whole on worker 0. The first step's
  outputs and 10 steps' tables equal the numpy reference."""
  batches_path, batches = _write_batches(str(tmp_path), optimizer)
  # The mixed run trains a row-wise lookup beside (two traced steps whose
  # collectives interleave, as a train and an eval step do).
  commands, envs = _mwms_commands(tmp_path, optimizer, batches_path,
                                  ["--layouts", layouts] +
                                  (["--beside-row-wise"] if layouts == "mixed" else []))
  procs, outputs = _run_group(commands, envs, cwd=REPO)
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  _check_against_reference(str(tmp_path), optimizer, batches, whole_tables=True,
                           beside=layouts == "mixed")


def _delta_chain_equals_end_checkpoint(make_lookup, delta_dir, end_checkpoint):
  """The 2 workers' delta chain (the chief's directory), restored in this
  process on 1 and on 2 replicas, holds every table's state (rows, slots,
  step; a dynamic table's ids, counts and pending ids too) exactly as the
  workers' end checkpoint (tf.train, whole tables) does."""
  from tests.unit.test_sharded import mirrored  # pylint: disable=g-import-not-at-top
  kinds = [link["kind"] for link in
           tfde.checkpoint.DeltaCheckpointManager(tf.train.Checkpoint(), delta_dir).links()]
  assert kinds[0] == "full" and kinds.count("delta") >= 3, kinds
  want_lookup = make_lookup()
  tf.train.Checkpoint(lookup=want_lookup).read(end_checkpoint).assert_consumed()
  want = {n: {k: np.asarray(v) for k, v in t.state().items()}
          for n, t in want_lookup.tables.items()}
  for n in (1, 2):
    with mirrored(n).scope():
      lookup = make_lookup()
    manager = tfde.checkpoint.DeltaCheckpointManager(tf.train.Checkpoint(lookup=lookup),
                                                     delta_dir)
    assert manager.restore() is not None
    for name, table in lookup.tables.items():
      got = table.state()
      assert sorted(got) == sorted(want[name]), name
      for key, value in got.items():
        np.testing.assert_array_equal(np.asarray(value), want[name][key],
                                      err_msg=f"{n} replicas, table {name}, {key}")


def _checkpoint_with_another_table_b(tmp_path):
  """A checkpoint of the harness's tables (ftrl; other seeds, so every
  table's values differ from the workers') whose table B has 60 rows, not
  50: restoring it into the harness must fail on B."""
  configs = h.feature_configs("ftrl", 3)
  for feature in configs.values():
    feature.table.seed += 100
    if feature.table.name == "B":
      feature.table.vocabulary_size = 60
  lookup = h.sharded_lookup(configs)
  return tf.train.Checkpoint(lookup=lookup).write(str(tmp_path / "bad" / "ckpt"))


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("optimizer", ["adam", "ftrl", "rowwise_adagrad"])
def test_multi_worker_mirrored_two_processes(tmp_path, optimizer):
  batches_path, batches = _write_batches(str(tmp_path), optimizer)
  # The adam and row-wise Adagrad ([V, 1] slots) runs also write delta
  # checkpoints (a chain of 5 saves) and an end checkpoint, each worker
  # saving every step; the ftrl run first restores a checkpoint whose
  # table B has another shape.
  deltas = optimizer in ("adam", "rowwise_adagrad")
  extra = ["--delta-dir", str(tmp_path / "deltas"), "--delta-full-every", "5",
           "--checkpoint", str(tmp_path / "end")] if deltas else [
               "--bad-checkpoint", _checkpoint_with_another_table_b(tmp_path)]
  # The ftrl run exchanges the rows of unique ids, the others partial sums;
  # in the adam run the workers' batches differ in size.
  extra += ["--exchange", "rows" if optimizer == "ftrl" else "auto"]
  extra += ["--uneven"] if optimizer == "adam" else []
  commands, envs = _mwms_commands(tmp_path, optimizer, batches_path, extra)
  procs, outputs = _run_group(commands, envs, cwd=REPO)
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  _check_against_reference(str(tmp_path), optimizer, batches)
  if optimizer == "ftrl":
    # Under MultiWorkerMirroredStrategy too, a restore checks every table
    # before it writes one: B is refused by name, A and C unchanged.
    for r in range(NUM_WORKERS):
      result = np.load(os.path.join(tmp_path, f"worker_{r}.npz"))
      assert "table 'B'" in str(result["bad_restore_error"]), str(result["bad_restore_error"])
      assert not bool(result["bad_restore_changed"])
  if deltas:
    variant = h.variant_of(optimizer)
    _delta_chain_equals_end_checkpoint(
        lambda: h.sharded_lookup(h.feature_configs(optimizer, variant)),
        str(tmp_path / "deltas"), str(tmp_path / "end"))


@functools.lru_cache(maxsize=None)
def _horovod_env_ready():
  """(whether the Horovod environment imports Horovod and tfde's kernels,
  why not). Probed once per test process: the probe is a Python importing
  TensorFlow (about 8 s of CPU), and every Horovod test asks."""
  python = os.path.join(HVD_VENV, "bin", "python")
  if not os.path.exists(os.path.join(HVD_VENV, "bin", "horovodrun")):
    return False, f"{HVD_VENV}/bin/horovodrun not found"
  if not os.path.exists(HVD_OPS):
    return False, f"{HVD_OPS} not found (python3 tools/envs.py ops hvd)"
  probe = subprocess.run([python, "-c", "import horovod.tensorflow, tfde.ops; "
                          "assert tfde.ops.kernels_available()"],
                         capture_output=True, text=True,
                         env=dict(horovod_env(), TF_CPP_MIN_LOG_LEVEL="3"), cwd="/")
  if probe.returncode:
    return False, probe.stderr[-1000:]
  return True, ""


def _horovodrun(tmp_path, module_args, ranks=NUM_WORKERS):
  """Runs `python -m MODULE_ARGS` on `ranks` Horovod ranks (Gloo) in the
  Horovod environment (`horovod_env`); skips without that environment, or
  fails when TFDE_REQUIRE_HOROVOD=1."""
  ready, why = _horovod_env_ready()
  if not ready:
    if os.environ.get("TFDE_REQUIRE_HOROVOD") == "1":
      pytest.fail(f"Horovod environment missing: {why}")
    pytest.skip(f"Horovod environment missing (make hvd-env): {why}")
  command, env = horovodrun_command(ranks, module_args)
  procs, outputs = _run_group([command], [env], cwd=str(tmp_path))
  assert procs[0].returncode == 0, outputs[0][-3000:]


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("optimizer", ["adagrad", "sgd", "rowwise_adagrad"])
def test_horovod_two_ranks(tmp_path, optimizer):
  batches_path, batches = _write_batches(str(tmp_path), optimizer)
  # The sgd run exchanges the rows of unique ids, the others partial sums;
  # in the adagrad run the ranks' batches differ in size.
  _horovodrun(tmp_path, ["tests.workers.multiprocess_worker", "--mode", "horovod",
                         "--optimizer", optimizer, "--batches", batches_path,
                         "--out", str(tmp_path),
                         "--exchange", "rows" if optimizer == "sgd" else "auto"] +
              (["--uneven"] if optimizer == "adagrad" else []))
  versions = {str(np.load(os.path.join(tmp_path, f"worker_{r}.npz"))["tf_version"])
              for r in range(NUM_WORKERS)}
  assert versions == {"2.18.1"}, versions
  _check_against_reference(str(tmp_path), optimizer, batches)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_keras_fit_under_multi_worker_mirrored(tmp_path):
  """model.fit / evaluate / predict with DistributedEmbedding on 2 worker
  processes: the loss falls, both workers agree on the dense weights and on
  the replicated table, and the sharded table's two halves are disjoint
  shards that both trained."""
  from tests.unit import test_layers
  x, y = test_layers._ranking_data(4096, seed=3)  # pylint: disable=protected-access
  data = tmp_path / "data.npz"
  np.savez(data, user_id=x["user_id"], movie_id=x["movie_id"], y=y)
  commands, envs = _worker_group(["-m", "tests.workers.keras_worker", "--data",
                                  str(data), "--out", str(tmp_path)])
  procs, outputs = _run_group(commands, envs, cwd=REPO)
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  results = [np.load(tmp_path / f"keras_{r}.npz") for r in range(NUM_WORKERS)]
  loss = results[0]["loss"]
  assert loss[-1] < 0.7 * loss[0], loss
  np.testing.assert_allclose(results[0]["dense_kernel"], results[1]["dense_kernel"],
                             rtol=1e-6)
  assert bool(results[0]["replicated/user"]) and not bool(results[0]["replicated/movie"])
  np.testing.assert_allclose(results[0]["shard/user"], results[1]["shard/user"],
                             rtol=1e-6)
  assert results[0]["shard/movie"].shape == (10000, 16)
  assert not np.allclose(results[0]["shard/movie"], results[1]["shard/movie"])
  assert results[0]["predictions"].shape[1] == 1


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_workers_out_of_step_fail_naming_both_steps(tmp_path):
  """A worker one step ahead of its peer (as one that went on after a
  failed step) makes both workers fail at their next exchange, naming both
  steps, instead of pairing different steps silently."""
  path, _ = _write_batches(str(tmp_path), "sgd")
  commands, envs = _mwms_commands(tmp_path, "sgd", path, ["--out-of-step-at", "2"])
  procs, outputs = _run_group(commands, envs, REPO)
  assert "TIMEOUT" not in outputs, outputs
  for p, out in zip(procs, outputs):
    assert p.returncode != 0, out[-3000:]
  joined = "\n".join(outputs)
  assert "out of step" in joined and "is at step 3" in joined and "is at step 2" in joined, \
      joined[-4000:]


def test_killed_multi_worker_run_resumes_to_the_uninterrupted_result(tmp_path):
  """2 workers save a checkpoint after every step and die before step 4 of
  6; restarted, they restore the latest checkpoint and finish. The tables
  equal the numpy reference of the uninterrupted 6 steps, and a single
  process restores the 2-worker checkpoint exactly."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  optimizer = "adam"
  variant = h.variant_of(optimizer)
  batches = [h.make_batch(s, weighted=True, seed=variant,
                          num_replicas=NUM_WORKERS) for s in range(6)]
  batches_path = str(tmp_path / "batches.pkl")
  with open(batches_path, "wb") as f:
    pickle.dump(batches, f)
  checkpoints = str(tmp_path / "ckpt")
  commands, envs = _mwms_commands(tmp_path, optimizer, batches_path,
                                  ["--checkpoint-dir", checkpoints, "--die-at-step", "4"])
  procs, outputs = _run_group(commands, envs, cwd=REPO)
  for p, out in zip(procs, outputs):
    assert p.returncode == 3, out[-3000:]
    assert "dies before step 4" in out
  assert tf.train.latest_checkpoint(checkpoints).endswith("ckpt-4")

  commands, envs = _mwms_commands(tmp_path, optimizer, batches_path,
                                  ["--checkpoint-dir", checkpoints, "--resume"])
  procs, outputs = _run_group(commands, envs, cwd=REPO)
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
    assert "at step 4" in out

  configs = h.feature_configs(optimizer, variant)
  results = [np.load(os.path.join(tmp_path, f"worker_{r}.npz"))
             for r in range(NUM_WORKERS)]
  final = {n: tfde.sharding.unshard_table([r[f"final/{n}"] for r in results],
                                          h.TABLES[n][0]) for n in h.TABLES}
  # The initial tables do not depend on the replica count.
  fresh = h.sharded_lookup(configs)
  _, want = h.reference_run(configs, fresh.table_values(), batches)
  for n in h.TABLES:
    np.testing.assert_allclose(final[n], want[n], rtol=1e-5, atol=1e-6,
                               err_msg=f"table {n}")

  # From 2 worker processes to 1 process: the same tables, slots and step.
  single = h.sharded_lookup(configs)
  tf.train.Checkpoint(lookup=single).restore(
      tf.train.latest_checkpoint(checkpoints)).assert_consumed()
  for n in h.TABLES:
    np.testing.assert_array_equal(single.tables[n].full_table(), final[n])
    assert int(single.tables[n].steps[0].numpy()) == 6


# ---- dynamic tables across processes


def _dynamic_batches(out_dir):
  batches = [dynamic_harness.make_batch(s) for s in range(DYNAMIC_STEPS)]
  path = os.path.join(out_dir, "dynamic_batches.pkl")
  with open(path, "wb") as f:
    pickle.dump(batches, f)
  return path, batches


def _check_dynamic(out_dir, optimizer, batches, first_step=0):
  """Each worker's outputs (from `first_step` on) and the gathered table
  against the dict oracle of all the batches."""
  results = [np.load(os.path.join(out_dir, f"dynamic_{r}.npz"))
             for r in range(NUM_WORKERS)]
  oracle = dynamic_harness.oracle_for(optimizer, admit_after=2, evict_after_steps=4)
  for index, batch in enumerate(batches):
    want = dynamic_harness.oracle_step(oracle, batch)
    if index < first_step:
      continue
    for f in ("clicks", "pair"):
      got = np.concatenate([r[f"output/{index}/{f}"] for r in results])
      np.testing.assert_allclose(got, want[f], rtol=2e-5, atol=2e-6,
                                 err_msg=f"step {index} feature {f}")
  ids = sorted(oracle.rows)
  for r in results:  # every worker gathered the same whole table
    np.testing.assert_array_equal(r["table/ids"], ids)
    np.testing.assert_array_equal(r["table/counts"], [oracle.rows[k]["count"] for k in ids])
    np.testing.assert_allclose(r["table/table"], [oracle.rows[k]["w"] for k in ids],
                               rtol=2e-5, atol=2e-6)
  assert oracle.pending and len(ids) > 5


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_dynamic_table_wise_table_under_multi_worker_mirrored(tmp_path):
  """A dynamic table whole on worker 1 (table-wise; column-wise and
  replicated do not apply to dynamic tables): worker 0 sends it every id,
  and both workers' outputs and the gathered table equal the dict oracle
  (admission after 2 sightings, eviction after 4 unseen steps, FTRL)."""
  batches_path, batches = _dynamic_batches(str(tmp_path))
  commands, envs = _worker_group(["-m", "tests.workers.dynamic_worker", "--mode", "mwms",
                                  "--optimizer", "ftrl", "--batches", batches_path,
                                  "--out", str(tmp_path), "--layouts", "table_wise"])
  procs, outputs = _run_group(commands, envs, cwd=REPO)
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  _check_dynamic(str(tmp_path), "ftrl", batches)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_dynamic_table_under_multi_worker_mirrored(tmp_path):
  batches_path, batches = _dynamic_batches(str(tmp_path))
  checkpoint = str(tmp_path / "ckpt")
  commands, envs = _worker_group(["-m", "tests.workers.dynamic_worker", "--mode", "mwms",
                                  "--optimizer", "adam", "--batches", batches_path,
                                  "--out", str(tmp_path), "--checkpoint", checkpoint,
                                  "--delta-dir", str(tmp_path / "deltas"),
                                  "--delta-full-every", str(DYNAMIC_STEPS)])
  procs, outputs = _run_group(commands, envs, cwd=REPO)
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  _check_dynamic(str(tmp_path), "adam", batches)
  # One chain of deltas over every step (admissions and evictions in them).
  _delta_chain_equals_end_checkpoint(
      lambda: h.sharded_lookup(dynamic_harness.feature_configs(
          dynamic_harness.table_config("adam", admit_after=2, evict_after_steps=4))),
      str(tmp_path / "deltas"), checkpoint)
  # The 2-worker checkpoint restores into this single process unchanged.
  saved = np.load(os.path.join(tmp_path, "dynamic_0.npz"))
  lookup = h.sharded_lookup(dynamic_harness.feature_configs(
      dynamic_harness.table_config("adam", admit_after=2, evict_after_steps=4)))
  tf.train.Checkpoint(lookup=lookup).read(checkpoint).assert_consumed()
  for key, value in lookup.tables["users"].export_rows().items():
    np.testing.assert_array_equal(value, saved[f"table/{key}"], err_msg=key)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_dynamic_table_under_horovod(tmp_path):
  batches_path, batches = _dynamic_batches(str(tmp_path))
  _horovodrun(tmp_path, ["tests.workers.dynamic_worker", "--mode", "horovod", "--optimizer",
                         "ftrl", "--batches", batches_path, "--out", str(tmp_path)])
  _check_dynamic(str(tmp_path), "ftrl", batches)


# ---- the SOK door across Horovod ranks


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("ranks", [2, 4], ids=lambda n: f"np{n}")
def test_sok_door_under_horovod(tmp_path, ranks):
  """sok.Variable and sok.DynamicVariable sharded over 2 Horovod ranks,
  trained with a wrapped Keras Adam, equal one unsharded numpy model."""
  rng = np.random.default_rng(4)
  batch, vocab, dim, lr = 8, 30, 3, 0.05
  keys = [-2**40, 5, 9, 2**62, -1, 123456789]
  steps = []
  for _ in range(4):
    steps.append(dict(
        static=[[int(x) for x in rng.integers(0, vocab, rng.integers(0, 4))]
                for _ in range(batch)],
        dynamic=[[int(x) for x in rng.choice(keys, rng.integers(1, 3))]
                 for _ in range(batch)],
        targets=[rng.normal(size=(batch, dim)).astype(np.float32) for _ in range(2)]))
  initial = rng.normal(size=(vocab, dim)).astype(np.float32)
  data = dict(global_batch=batch, dim=dim, lr=lr, initial=initial, steps=steps)
  path = os.path.join(tmp_path, "sok.pkl")
  with open(path, "wb") as f:
    pickle.dump(data, f)
  _horovodrun(tmp_path, ["tests.workers.sok_worker", "--data", path, "--out", str(tmp_path)],
              ranks)
  results = [np.load(os.path.join(tmp_path, f"sok_{r}.npz")) for r in range(ranks)]

  hp = dict(learning_rate=lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
  table = initial.astype(np.float64)
  static_opt = oracles.NumpyOptimizer("adam", table.shape, **hp)
  dynamic = oracles.DynamicTableOracle(dim, "adam", hp, init=("uniform", -0.5, 0.5))
  for index, step in enumerate(steps):
    out = oracles.combine(table, step["static"], None, "sum")
    got = np.concatenate([r[f"output/{index}/static"] for r in results])
    np.testing.assert_allclose(got, out, rtol=2e-5, atol=2e-6, err_msg=f"step {index}")
    grad = oracles.combine_grad_dense(vocab, 2.0 * (out - step["targets"][0]) / batch,
                                      step["static"], None, "sum")
    rows = sorted({i for row in step["static"] for i in row})
    static_opt.apply(table, rows, grad[rows])
    want = dynamic.train_step([(step["dynamic"], None, "mean", step["targets"][1],
                                1.0 / batch)])[0]
    got = np.concatenate([r[f"output/{index}/dynamic"] for r in results])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"step {index}")
  for r in results:
    np.testing.assert_allclose(r["static_table"], table, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(r["dynamic/ids"], sorted(dynamic.rows))
    np.testing.assert_allclose(r["dynamic/table"],
                               [dynamic.rows[k]["w"] for k in sorted(dynamic.rows)],
                               rtol=2e-5, atol=2e-6)


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("ranks", [2, 4], ids=lambda n: f"np{n}")
def test_mxrec_flow_under_horovod(tmp_path, ranks):
  """mxRec's TF1 flow over 2 Horovod ranks: ids routed to their owner,
  local-embedding gradients returned through the exchange, applied by
  address; equals the dict oracle over the global batch."""
  rng = np.random.default_rng(9)
  batch, slots, dim, lr = 8, 2, 3, 0.05
  pool = np.array([7, -3, 2**62 + 1, 40, -2**50, 11, 8], np.int64)
  steps = [dict(ids=pool[np.minimum(rng.zipf(1.5, (batch, slots)) - 1, len(pool) - 1)],
                target=rng.normal(size=(batch, slots, dim)).astype(np.float32))
           for _ in range(5)]
  path = os.path.join(tmp_path, "mxrec.pkl")
  with open(path, "wb") as f:
    pickle.dump(dict(batch=batch, slots=slots, dim=dim, lr=lr, steps=steps), f)
  _horovodrun(tmp_path, ["tests.workers.mxrec_worker", "--data", path, "--out", str(tmp_path)],
              ranks)
  results = [np.load(os.path.join(tmp_path, f"mxrec_{r}.npz")) for r in range(ranks)]
  oracle = oracles.DynamicTableOracle(
      dim, "adam", dict(learning_rate=lr, beta_1=0.8, beta_2=0.95, epsilon=1e-7),
      init=("uniform", -0.5, 0.5))
  for index, step in enumerate(steps):
    want = oracle.train_step([([[int(k)] for k in step["ids"].ravel()], None, "sum",
                               step["target"].reshape(-1, dim), 1.0)])[0]
    got = np.concatenate([r[f"output/{index}"] for r in results]).reshape(-1, dim)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"step {index}")
  ids = sorted(oracle.rows)
  for r in results:
    np.testing.assert_array_equal(r["table/ids"], ids)
    np.testing.assert_allclose(r["table/table"], [oracle.rows[k]["w"] for k in ids],
                               rtol=2e-5, atol=2e-6)


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_killed_dynamic_table_run_resumes_to_the_uninterrupted_result(tmp_path):
  """The dynamic-table run of 2 workers, checkpointed after every step,
  dies before step 3 of 6 and resumes: the rest of its outputs and its
  final table (rows, counts, pending ids) equal the uninterrupted oracle."""
  batches_path, batches = _dynamic_batches(str(tmp_path))
  checkpoints = str(tmp_path / "ckpt")

  def run(extra):
    return _run_group(*_worker_group(
        ["-m", "tests.workers.dynamic_worker", "--mode", "mwms", "--optimizer", "adam",
         "--batches", batches_path, "--out", str(tmp_path),
         "--checkpoint-dir", checkpoints] + extra), cwd=REPO)

  procs, outputs = run(["--die-at-step", "3"])
  for p, out in zip(procs, outputs):
    assert p.returncode == 3 and "dies before step 3" in out, out[-3000:]
  procs, outputs = run(["--resume"])
  for p, out in zip(procs, outputs):
    assert p.returncode == 0 and "at step 3" in out, out[-3000:]
  _check_dynamic(str(tmp_path), "adam", batches, first_step=3)
