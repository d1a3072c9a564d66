"""tfde.serving.apply_delta on disk is atomic: killed at any moment of its
write, it leaves the export at the old version or the new one, whole (a
server polling the directory loads either, never a broken one)."""

import os
import random
import shutil
import time

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import zygote

KILLS = 8


def _export_and_delta(tmp_path):
  # Large enough that writing the variables takes a while (~0.1 s here).
  table = tfde.layers.TableConfig(name="t", vocabulary_size=400_000, embedding_dim=16,
                                  optimizer="sgd")
  layer = tfde.layers.DistributedEmbedding(
      {"f": tfde.layers.FeatureConfig(name="f", table=table)})
  ids = tf.constant([[1, 2, 3]], tf.int64)
  tfde.export_for_serving(layer, str(tmp_path / "pristine"), {"f": ids})
  old = layer({"f": ids})["f"].numpy()
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layer({"f": ids})["f"])
  tape.gradient(loss, layer.trainable_variables)
  new = layer({"f": ids})["f"].numpy()
  info = tfde.serving.export_delta(layer, str(tmp_path / "delta"), base=tmp_path / "pristine")
  assert not np.array_equal(old, new)
  return ids, old, new, info


def _first_line(worker, output, timeout=120):
  """The first line `worker` (a `ForkedProcess`) writes to `output`, once
  it is whole; its output so far if it ends first."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(output) as f:
      text = f.read()
    if "\n" in text:
      return text.split("\n", 1)[0]
    if worker.poll() is not None:
      return text
    time.sleep(0.01)
  return f"(no line in {timeout} s)"


def test_a_kill_during_apply_delta_leaves_the_old_or_the_new_version(tmp_path):
  ids, old, new, info = _export_and_delta(tmp_path)
  env = dict(os.environ, PYTHONPATH=zygote.REPO)
  rng = random.Random(0)
  seen = []
  # The workers fork from one process that imported TensorFlow and tfde
  # (tests/support/zygote.py): each kill then costs its rehearsal, not the
  # imports' seconds.
  server = zygote.shared()
  for attempt in range(KILLS):
    target = tmp_path / "export"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(tmp_path / "pristine", target)
    output = str(tmp_path / f"worker_{attempt}.out")
    errors = str(tmp_path / f"worker_{attempt}.err")
    worker = server.start("tests.workers.apply_delta_kill_worker",
                          [str(tmp_path / "pristine"), str(tmp_path / "scratch"), str(target),
                           str(tmp_path / "delta")], env, output, error_output=errors)
    line = _first_line(worker, output).split()
    assert line and line[0] == "applying", open(errors).read()[-3000:]
    before_write, total = float(line[1]), float(line[2])
    time.sleep(rng.uniform(before_write, 1.1 * total))
    worker.kill()
    worker.wait(60)
    # What a server polling the directory loads now.
    try:
      served = tf.saved_model.load(str(target))
    except Exception as e:  # pylint: disable=broad-except
      raise AssertionError(f"kill {attempt} ({seen}) left an export that does not "
                           f"load: {e}") from None
    got = served.serve({"f": ids})["f"].numpy()
    version = int(served.delta_version.numpy())
    if version == info["version"]:
      np.testing.assert_allclose(got, new, rtol=1e-5, atol=1e-6)
      seen.append("new")
    else:
      assert version == info["base_version"]
      np.testing.assert_allclose(got, old, rtol=1e-5, atol=1e-6)
      seen.append("old")
  # What a killed run left beside the export goes with the next apply.
  if seen[-1] == "old":
    tfde.serving.apply_delta(str(target), str(tmp_path / "delta"))
  else:
    with pytest.raises(tf.errors.InvalidArgumentError, match="another version"):
      tfde.serving.apply_delta(str(target), str(tmp_path / "delta"))
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".export.")], os.listdir(tmp_path)
  assert int(tf.saved_model.load(str(target)).delta_version.numpy()) == info["version"]


def test_a_kill_between_the_fallbacks_two_renames_keeps_the_old_version(tmp_path, monkeypatch):
  """Where the exchange is not available, the old version waits aside
  while the new one is renamed in; a kill there leaves the export absent,
  and the next apply puts the old version back before removing leftovers."""
  from tfde import atomic_files  # pylint: disable=g-import-not-at-top
  target, staging = tmp_path / "export", tmp_path / ".export.applying-7"
  for folder, text in ((target, "old"), (staging, "new")):
    folder.mkdir()
    (folder / "f").write_text(text)
  monkeypatch.setattr(atomic_files, "_exchange", lambda a, b: False)
  renames = []
  real_rename = os.rename

  def rename_then_die(a, b):
    if renames:
      raise KeyboardInterrupt("killed between the renames")
    renames.append((a, b))
    real_rename(a, b)

  monkeypatch.setattr(atomic_files.os, "rename", rename_then_die)
  with pytest.raises(KeyboardInterrupt):
    atomic_files.replace_directory(str(staging), str(target))
  monkeypatch.setattr(atomic_files.os, "rename", real_rename)
  assert not target.exists()
  atomic_files.recover(str(target), str(tmp_path), ".export.applying-")
  atomic_files.remove_stale(str(tmp_path), ".export.applying-")
  assert (target / "f").read_text() == "old"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_an_export_behind_a_link_is_applied_and_the_link_stays(tmp_path):
  from tfde import atomic_files  # pylint: disable=g-import-not-at-top
  real, link = tmp_path / "v1", tmp_path / "served"
  real.mkdir()
  (real / "f").write_text("old")
  link.symlink_to(real)
  target = os.path.realpath(link)
  staging = tmp_path / ".v1.applying-1"
  staging.mkdir()
  (staging / "f").write_text("new")
  atomic_files.replace_directory(str(staging), target)
  assert link.is_symlink() and (link / "f").read_text() == "new"
