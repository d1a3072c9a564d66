"""Reliability across processes (issue 18, points 3 and 5): non-finite
gradients under MultiWorkerMirroredStrategy and Horovod, and peers that die
or stall.

Each test is one launch of 2 or 4 processes, with several checks inside.
"""

import json
import os
import pickle
import signal
import sys
import time

import numpy as np
import pytest

import tfde
from tests.distributed import test_multiprocess as mp
from tests.support import sharded_harness as h

STEPS = 6


def _nonfinite_batches(tmp_path):
  batches = [h.make_batch(s, weighted=True, seed=2, num_replicas=mp.NUM_WORKERS)
             for s in range(STEPS)]
  path = str(tmp_path / "batches.pkl")
  with open(path, "wb") as f:
    pickle.dump(batches, f)
  return path


def _check_nonfinite(out_dir):
  """Every worker: step 1 skipped A's update and counted it, B and C
  trained; step 2 raised an error naming table B and step 3, and changed
  no table, slot or step: not of B's group, nor of C (another exchange);
  step 3 (an id past table C on the last worker) raised on every worker
  (the last naming the id, the others the worker and feature), none
  waiting for another, and changed nothing; so did step 4 (malformed
  row splits of b_ragged on the last worker); step 5 trained every table."""
  results = [dict(np.load(os.path.join(out_dir, f"nonfinite_{r}.npz")))
             for r in range(mp.NUM_WORKERS)]
  last = mp.NUM_WORKERS - 1
  vocab_c = h.TABLES["C"][0]
  for rank, r in enumerate(results):
    assert not str(r["error_0"]) and not str(r["error_1"]), rank
    assert "table B: the gradient of step 3 holds NaN or Inf" in str(r["error_2"]), \
        (rank, str(r["error_2"]))
    want = (f"feature c_single (table C): id {vocab_c + 5} at position"
            if rank == last else
            f"replica {last} refused an id of feature c_single (table C) (its error "
            "names it), so the step of this replica is refused too")
    assert want in str(r["error_3"]), (rank, str(r["error_3"]))
    want = ("feature b_ragged (table B): ragged ids have row splits" if rank == last else
            f"replica {last} refused the input of feature b_ragged (table B) (its "
            "error names it), so the step of this replica is refused too")
    assert want in str(r["error_4"]), (rank, str(r["error_4"]))
    assert not str(r["error_5"]), (rank, str(r["error_5"]))
    assert "C" not in r["group_of_B"].tolist()  # C has an exchange of its own
    for name in h.TABLES:
      keys = [k.split("/", 2)[2] for k in r if k.startswith(f"after_0/{name}/")]
      # Step 1: A unchanged (skipped), B and C updated.
      for key in keys:
        if key in ("step", "skips"):
          continue
        same = np.array_equal(r[f"after_1/{name}/{key}"], r[f"after_0/{name}/{key}"])
        assert same == (name == "A"), (rank, name, key)
      assert int(r[f"after_1/{name}/step"]) == (1 if name == "A" else 2), (rank, name)
      assert int(r[f"after_1/{name}/skips"]) == (1 if name == "A" else 0), (rank, name)
      # Step 2: the error, and every table as it was: B's group (B and A:
      # one exchange) and C, of another exchange.
      for key in keys:
        np.testing.assert_array_equal(r[f"after_2/{name}/{key}"], r[f"after_1/{name}/{key}"],
                                      err_msg=f"worker {rank}: table {name} {key} changed")
        for refused in (3, 4):
          np.testing.assert_array_equal(
              r[f"after_{refused}/{name}/{key}"], r[f"after_1/{name}/{key}"],
              err_msg=f"worker {rank}: step {refused} changed table {name} {key}")
      # Step 5 trained (each worker's shard holds rows the batch reads).
      assert int(r[f"after_5/{name}/step"]) == int(r[f"after_1/{name}/step"]) + 1, (rank, name)
      assert not np.array_equal(r[f"after_5/{name}/table"], r[f"after_1/{name}/table"]), \
          (rank, name)
  # The replicated counters agree across workers.
  for name in h.TABLES:
    for key in ("step", "skips"):
      assert len({int(r[f"after_5/{name}/{key}"]) for r in results}) == 1, (name, key)


@pytest.mark.timeout(mp.TIMEOUT_S + 60)
def test_nonfinite_gradients_under_multi_worker_mirrored(tmp_path):
  path = _nonfinite_batches(tmp_path)
  commands, envs = mp._worker_group(  # pylint: disable=protected-access
      ["-m", "tests.workers.nonfinite_worker", "--mode", "mwms", "--batches", path,
       "--out", str(tmp_path)])
  procs, outputs = mp._run_group(commands, envs, cwd=mp.REPO)  # pylint: disable=protected-access
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  _check_nonfinite(str(tmp_path))


@pytest.mark.timeout(mp.TIMEOUT_S + 60)
def test_nonfinite_gradients_under_horovod(tmp_path):
  path = _nonfinite_batches(tmp_path)
  mp._horovodrun(tmp_path, ["tests.workers.nonfinite_worker", "--mode", "horovod",  # pylint: disable=protected-access
                            "--batches", path, "--out", str(tmp_path)])
  _check_nonfinite(str(tmp_path))


# ---- peers that die or stall

# Measured on a loaded 2-core machine (docs/reliability.md): a
# killed peer fails every survivor within 10 s (2 to 5.3 s measured); a
# stopped one within 12 s under MultiWorkerMirroredStrategy (4 workers),
# and under Horovod within its Gloo timeout plus about 17 s (47 s with the
# default 30 s, 27 s with the 10 s set below). The tests allow the
# documented bounds.
SURVIVORS_EXIT_S = {"SIGKILL": 30, "SIGSTOP": 90}
PEER_STEPS = 8
HOROVOD_GLOO_TIMEOUT_S = 10


def _peer_batches(tmp_path, workers):
  batches = [h.make_batch(s, weighted=True, seed=2, num_replicas=workers)
             for s in range(PEER_STEPS)]
  path = str(tmp_path / "batches.pkl")
  with open(path, "wb") as f:
    pickle.dump(batches, f)
  return path, batches


def _read_int(path):
  try:
    with open(path) as f:
      return int(f.read())
  except (OSError, ValueError):
    return None


def _fail_a_peer(out_dir, workers, procs, signal_name, victim):
  """Waits until every worker has done 2 steps, sends `signal_name` to
  worker `victim`, and returns the seconds until every process in `procs`
  (the survivors, or horovodrun) exited, and the outputs of all."""
  deadline = time.time() + mp.TIMEOUT_S
  while time.time() < deadline:
    steps = [_read_int(os.path.join(out_dir, f"progress_{r}")) for r in range(workers)]
    if all(s is not None and s >= 2 for s in steps):
      break
    assert all(p.poll() is None for p in procs), [p.communicate()[0][-2000:] for p in procs]
    time.sleep(0.1)
  else:
    pytest.fail(f"the workers never reached step 2: {steps}")
  pid = _read_int(os.path.join(out_dir, f"pid_{victim}"))
  os.kill(pid, getattr(signal, signal_name))
  killed_at = time.time()
  bound = SURVIVORS_EXIT_S[signal_name]
  try:
    while time.time() - killed_at < bound + 30 and any(p.poll() is None for p in procs):
      time.sleep(0.05)
    seconds = time.time() - killed_at
  finally:
    outputs = []
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
      outputs.append(p.communicate()[0])
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  return seconds, outputs


def _check_survivors(procs, outputs, seconds, signal_name):
  for p, out in zip(procs, outputs):
    assert p.returncode not in (0, None, -signal.SIGKILL), (p.returncode, out[-3000:])
  assert seconds < SURVIVORS_EXIT_S[signal_name], (seconds, [o[-1500:] for o in outputs])
  print(f"{signal_name}: every survivor exited non-zero {seconds:.1f} s after", flush=True)


def _mwms_group(tmp_path, workers, extra):
  ports = mp._free_ports(workers)  # pylint: disable=protected-access
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  commands, envs = [], []
  for index in range(workers):
    envs.append(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=mp.REPO,
                     TF_CONFIG=json.dumps({"cluster": cluster, "task": {
                         "type": "worker", "index": index}})))
    commands.append([sys.executable, "-m", "tests.workers.peer_worker", "--mode", "mwms",
                     "--out", str(tmp_path)] + extra)
  return commands, envs


@pytest.mark.timeout(3 * mp.TIMEOUT_S)
def test_killed_peer_fails_every_survivor_and_a_restart_resumes(tmp_path):
  """2 MultiWorkerMirroredStrategy workers checkpointing every step; worker
  1 is SIGKILLed mid-run: worker 0 exits non-zero within the bound. A
  restart resumes from the latest checkpoint and ends at the numpy
  reference of the uninterrupted run."""
  path, batches = _peer_batches(tmp_path, 2)
  checkpoints = str(tmp_path / "ckpt")
  extra = ["--batches", path, "--pace", "0.3", "--checkpoint-dir", checkpoints]
  commands, envs = _mwms_group(tmp_path, 2, extra)
  procs = mp.launch(commands, envs, mp.REPO)
  seconds, outputs = _fail_a_peer(str(tmp_path), 2, procs, "SIGKILL", victim=1)
  _check_survivors(procs[:1], outputs[:1], seconds, "SIGKILL")

  commands, envs = _mwms_group(tmp_path, 2, ["--batches", path, "--checkpoint-dir",
                                             checkpoints, "--resume"])
  procs, outputs = mp._run_group(commands, envs, cwd=mp.REPO)  # pylint: disable=protected-access
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
    assert "resumed from" in out, out[-3000:]
  _check_resumed(tmp_path, batches)


def _check_resumed(tmp_path, batches):
  """The 2 workers' final shards (after a restart) equal the numpy
  reference of the uninterrupted run."""
  configs = h.feature_configs("adam", 2)
  results = [np.load(os.path.join(tmp_path, f"peer_{r}.npz")) for r in range(2)]
  final = {n: tfde.sharding.unshard_table([r[f"final/{n}"] for r in results],
                                          h.TABLES[n][0]) for n in h.TABLES}
  _, want = h.reference_run(configs, h.sharded_lookup(configs).table_values(), batches)
  for n in h.TABLES:
    np.testing.assert_allclose(final[n], want[n], rtol=1e-5, atol=1e-6, err_msg=f"table {n}")


# The grid {MultiWorkerMirroredStrategy, Horovod} x {SIGKILL, SIGSTOP} x
# {2, 4 processes}. MWMS (2, SIGKILL) is the test above, with its restart.
# The Horovod cells (about 30 s each) run where TFDE_PEER_TESTS=1: `make
# test` and `make reliability` set it.
MWMS_CELLS = [(2, "SIGSTOP"), (4, "SIGKILL"), (4, "SIGSTOP")]
HOROVOD_CELLS = [(2, "SIGKILL"), (2, "SIGSTOP"), (4, "SIGKILL"), (4, "SIGSTOP")]


@pytest.mark.timeout(2 * mp.TIMEOUT_S)
@pytest.mark.parametrize("workers,signal_name", MWMS_CELLS)
def test_failed_peer_ends_a_multi_worker_mirrored_job(tmp_path, workers, signal_name):
  """`workers` MultiWorkerMirroredStrategy workers; the last one is killed
  or stopped: every other exits non-zero within the bound, no hang."""
  path, _ = _peer_batches(tmp_path, workers)
  commands, envs = _mwms_group(tmp_path, workers, ["--batches", path, "--pace", "0.3"])
  procs = mp.launch(commands, envs, mp.REPO)
  victim = workers - 1
  survivors = [p for r, p in enumerate(procs) if r != victim]
  seconds, outputs = _fail_a_peer(str(tmp_path), workers, survivors, signal_name,
                                  victim=victim)
  for p in procs:
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait()
  _check_survivors(survivors, outputs, seconds, signal_name)


def _horovod_launch(tmp_path, ranks, path, extra=("--pace", "0.3")):
  ready, why = mp._horovod_env_ready()  # pylint: disable=protected-access
  if not ready:
    if os.environ.get("TFDE_REQUIRE_HOROVOD") == "1":
      pytest.fail(f"Horovod environment missing: {why}")
    pytest.skip(f"Horovod environment missing (make hvd-env): {why}")
  # Gloo's timeout bounds how long ranks wait for a stalled peer (30 s by
  # default); shorter here to keep the test short.
  command, env = mp.horovodrun_command(
      ranks, ["tests.workers.peer_worker", "--mode", "horovod", "--batches", path,
              "--out", str(tmp_path)] + list(extra),
      dict(mp.horovod_env(), HOROVOD_GLOO_TIMEOUT_SECONDS=str(HOROVOD_GLOO_TIMEOUT_S)))
  return mp.launch([command], [env], str(tmp_path))


@pytest.mark.timeout(2 * mp.TIMEOUT_S)
@pytest.mark.parametrize("ranks,signal_name", HOROVOD_CELLS)
def test_failed_peer_ends_a_horovod_job(tmp_path, ranks, signal_name):
  """horovodrun with `ranks` ranks; rank 1 is killed or stopped: horovodrun
  (and with it every rank) exits non-zero within the bound. About 30 s
  each, run where TFDE_PEER_TESTS=1 (`make test`, `make reliability`)."""
  if os.environ.get("TFDE_PEER_TESTS") != "1":
    pytest.skip("make test and make reliability run it (TFDE_PEER_TESTS=1)")
  path, batches = _peer_batches(tmp_path, ranks)
  # The 2-rank kill also checkpoints every step, and restarts from it.
  resumes = (ranks, signal_name) == (2, "SIGKILL")
  checkpoints = ["--checkpoint-dir", str(tmp_path / "ckpt")] if resumes else []
  procs = _horovod_launch(tmp_path, ranks, path, ["--pace", "0.3"] + checkpoints)
  seconds, outputs = _fail_a_peer(str(tmp_path), ranks, procs, signal_name, victim=1)
  _check_survivors(procs, outputs, seconds, signal_name)
  if resumes:
    procs = _horovod_launch(tmp_path, ranks, path, checkpoints + ["--resume"])
    out = procs[0].communicate(timeout=mp.TIMEOUT_S)[0]
    assert procs[0].returncode == 0, out[-3000:]
    assert out.count("resumed from") == 2, out[-3000:]
    _check_resumed(tmp_path, batches)
