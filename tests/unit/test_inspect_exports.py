"""`tfde inspect` on a Keras model's serving export and on its delta
exports (what `tfde train --delta-every` writes), against the model's
tables read in memory (the oracle), as it reads a layer's export."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import tfde
from tests.unit import test_layers
from tfde.app import inspect as inspect_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(table, keys):
  return {k: np.asarray(v) for k, v in table.state(keys=keys).items()}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
  """A model's full export, then a delta after more training (users
  unseen for 3 steps evicted); the tables' state at each."""
  directory = tmp_path_factory.mktemp("exports")
  keras.utils.set_random_seed(0)
  model = test_layers._ranking_model(  # pylint: disable=protected-access
      user_dynamic=tfde.DynamicConfig(evict_after_steps=3))
  model.compile(optimizer="adam", loss="mse")
  x, y = test_layers._ranking_data(384)  # pylint: disable=protected-access
  example = {k: v[:2] for k, v in x.items()}
  model.fit({k: v[:128] for k, v in x.items()}, y[:128], batch_size=32, verbose=0)
  layer = next(l for l in model._flatten_layers()  # pylint: disable=protected-access
               if isinstance(l, tfde.layers.DistributedEmbedding))
  base = {"movie": _state(layer.tables["movie"], ("table",)),
          "user": _state(layer.tables["user"], ("ids", "table"))}
  tfde.export_for_serving(model, str(directory / "full"), example)
  model.fit({k: v[128:] for k, v in x.items()}, y[128:], batch_size=32, verbose=0)
  info = tfde.serving.export_delta(model, str(directory / "delta"),
                                   base=str(directory / "full"))
  after = {"movie": _state(layer.tables["movie"], ("table",)),
           "user": _state(layer.tables["user"], ("ids", "table"))}
  return directory, base, after, info


def test_reads_a_keras_model_export(exports):
  directory, base, _, _ = exports
  kind, summaries = inspect_lib.read_tables(str(directory / "full"))
  assert kind == "savedmodel"
  by_name = {s.name: s for s in summaries}
  assert sorted(by_name) == ["movie", "user"]
  movie, user = by_name["movie"], by_name["user"]
  assert not movie.dynamic and movie.step is None
  np.testing.assert_array_equal(movie.rows, base["movie"]["table"])
  assert movie.row_bytes == 20000 * 16 * 4
  assert user.dynamic
  # The served rows of a dynamic table are those of its ids.
  want = dict(zip(base["user"]["ids"].tolist(), base["user"]["table"]))
  assert sorted(user.ids.tolist()) == sorted(want)
  for i, row in zip(user.ids.tolist(), user.rows):
    np.testing.assert_array_equal(row, want[i])


def test_reads_a_delta_export(exports):
  directory, base, after, info = exports
  kind, summaries = inspect_lib.read_tables(str(directory / "delta"))
  assert kind == "delta export"
  by_name = {s.name: s for s in summaries}
  assert sorted(by_name) == ["movie", "user"]
  movie, user = by_name["movie"], by_name["user"]
  assert len(movie.ids) + len(user.ids) == info["rows"] > 0
  # The changed rows are the tables' rows now, at their ids.
  np.testing.assert_array_equal(movie.rows, after["movie"]["table"][movie.ids])
  now = dict(zip(after["user"]["ids"].tolist(), after["user"]["table"]))
  for i, row in zip(user.ids.tolist(), user.rows):
    np.testing.assert_array_equal(row, now[i])
  # Users served before and gone now are removed.
  gone = set(base["user"]["ids"].tolist()) - set(now)
  assert gone and gone <= set(user.removed.tolist())
  assert movie.removed.size == 0


def test_command_prints_exports(exports):
  directory, _, _, _ = exports
  env = dict(os.environ, PYTHONPATH=REPO)
  for name, expected in [("full", ["savedmodel, 2 tables", "table movie (static; tables/"
                                   "embedding/movie)", "rows: 20,000 x 16 (float32)",
                                   "hot ids: not kept (a serving export keeps no counts)"]),
                         ("delta", ["delta export, 2 tables", "table user (delta;",
                                    "changed rows:", "removed ids:"])]:
    result = subprocess.run([sys.executable, "-m", "tfde.app", "inspect",
                             str(directory / name), "--hot", "3"],
                            capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for line in expected:
      assert line in result.stdout, result.stdout


def test_a_delta_missing_a_file_is_a_named_error(exports, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  directory, _, _, _ = exports
  copy = tmp_path / "delta"
  shutil.copytree(directory / "delta", copy)
  (copy / "t1.rows").unlink()
  with pytest.raises(inspect_lib.InspectError, match=r"cannot read the delta's t1\.rows"):
    inspect_lib.read_tables(str(copy))

