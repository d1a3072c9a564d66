"""A writer SIGKILLed at random moments during CheckpointManager.save
always leaves the latest listed checkpoint complete and restorable (static
and dynamic tables; one process, and two MultiWorkerMirroredStrategy
workers)."""

import os
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.distributed.test_multiprocess import REPO
from tests.distributed.test_multiprocess import _worker_group
from tests.support import zygote as zygote_lib
from tests.workers import save_worker

# Kills per mode: 10 in `make test`, more in `make reliability`
# (TFDE_CRASH_TRIALS=40), each a worker process forked afresh.
TRIALS = int(os.environ.get("TFDE_CRASH_TRIALS", "10"))
TIMEOUT_S = 120


def _start(mode, directory):
  """The writer's processes, forked by the fork servers: (its `ForkedProcess`,
  output file) each. The process object is kept while the child runs: the
  server kills a child whose requester's connection closes."""
  if mode == "local":
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    commands = [[sys.executable, "-m", "tests.workers.save_worker", "--mode", "local",
                 "--dir", directory]]
    envs = [env]
  else:
    commands, envs = _worker_group(["-m", "tests.workers.save_worker", "--mode", "mwms",
                                    "--dir", directory])
  os.makedirs(directory, exist_ok=True)
  children = []
  for i, (command, env) in enumerate(zip(commands, envs)):
    assert command[1] == "-m", command
    output = os.path.join(os.path.dirname(directory), f"{os.path.basename(directory)}_{i}.log")
    server = zygote_lib.for_worker(i)
    children.append((server.start(command[2], command[3:], env, output), output))
  return children


def _alive(pid):
  try:
    os.kill(pid, 0)
    with open(f"/proc/{pid}/stat") as f:   # a zombie is not alive
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (ProcessLookupError, FileNotFoundError):   # reaped meanwhile
    return False


def _kill_during_saves(mode, directory, periods):
  """Starts the writer, waits for its first two saves, and SIGKILLs every
  process `periods` save periods after the first (a period: the time from
  the first save to the second, measured in each trial, as the load of
  other tests changes it). Returns the period.

  The delay is counted in periods, not seconds, because one save takes
  0.1 s alone and 0.4 s for two MultiWorkerMirroredStrategy workers (1.5 s
  on a slow host): fixed delays all fell before the second save there.
  """
  children = _start(mode, directory)
  (chief, chief_output) = children[0]
  try:
    saved_at = []
    deadline = time.monotonic() + TIMEOUT_S
    with open(chief_output, "rb") as output:
      pending = b""
      while len(saved_at) < 2:
        assert time.monotonic() < deadline and _alive(chief.pid), (
            "no save: " + open(chief_output).read()[-2000:])
        chunk = output.read()
        if not chunk:
          time.sleep(0.01)
          continue
        *lines, pending = (pending + chunk).split(b"\n")
        saved_at += [time.monotonic() for line in lines if line.startswith(b"saved")]
    period = saved_at[1] - saved_at[0]
    time.sleep(max(0.0, saved_at[0] + periods * period - time.monotonic()))
  finally:
    for child, _ in children:
      for kill in (os.killpg, os.kill):   # its group, and itself in any case
        try:
          kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
    for child, _ in children:
      child.wait(TIMEOUT_S)
  return period


def _restored_value(directory):
  """The one value k every table, slot and step of the latest listed
  checkpoint holds (so it is complete)."""
  latest = tf.train.latest_checkpoint(directory)
  assert latest is not None, os.listdir(directory)
  lookup = tfde.lookup.ShardedLookup(save_worker.configs(), auto_replicate_bytes=0)
  tf.train.Checkpoint(lookup=lookup).restore(latest).assert_consumed()
  values = set()
  for table in lookup.tables.values():
    for key, value in table.state().items():
      if key in ("table", "step") or key.startswith("slot_"):
        values.update(np.unique(value.numpy()).tolist())
    if table.is_dynamic:
      assert table.size() == save_worker.DYNAMIC_IDS
  assert len(values) == 1, (latest, sorted(values)[:5])
  return values.pop()


@pytest.mark.parametrize("mode", ["local", "mwms"])
def test_a_killed_writer_leaves_a_complete_latest_checkpoint(tmp_path, mode):
  rng = np.random.default_rng(7)
  seen, periods = [], []
  # The writers fork from processes that imported TensorFlow and tfde
  # (tests/support/zygote.py): a trial then starts in a fraction of the
  # imports' seconds.
  for trial in range(TRIALS):
    directory = str(tmp_path / f"trial_{trial}")
    # 1 to 3.5 periods after the first save: during and after the third
    # and fourth (all ten kills before the third is done: 0.4^10).
    periods.append(_kill_during_saves(mode, directory, float(rng.uniform(1.0, 3.5))))
    seen.append(_restored_value(directory))
  # The kills fell at different points of the save loop.
  assert len(set(seen)) > 1, (seen, periods)
