"""Delta exports (tfde.serving.export_delta / apply_delta): a chain of
deltas applied to a base export serves every id exactly as a full export
of the same step, in an interpreter where tfde cannot be imported; a
missing, reordered or corrupted link is refused, changing nothing."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

import tfde
from tests.unit import test_layers

# A fresh interpreter (-I) with tfde blocked: the serving process.
SERVER = r"""
import json, sys
sys.modules["tfde"] = None
import numpy as np, tensorflow as tf
base, full, deltas, queries = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
x = {k: tf.constant(v, tf.int64) for k, v in np.load(queries).items()}
served = tf.saved_model.load(base)
result = {}
def refused(delta):
  before = served.serve(x).numpy()
  try:
    served.apply_delta(delta)
  except tf.errors.InvalidArgumentError as e:
    assert np.array_equal(served.serve(x).numpy(), before)  # nothing changed
    return e.message
  return None
result["skipping"] = refused(deltas[1])
for delta in deltas[:-1]:
  served.apply_delta(delta)
result["corrupted"] = refused(sys.argv[5])
served.apply_delta(deltas[-1])
want = tf.saved_model.load(full)
result["same_outputs"] = bool(np.array_equal(served.serve(x).numpy(), want.serve(x).numpy()))
result["same_static_rows"] = bool(np.array_equal(
    served.tables["embedding"]["movie"].numpy(), want.tables["embedding"]["movie"].numpy()))
print("RESULT" + json.dumps(result))
"""


def _model():
  keras.utils.set_random_seed(0)
  model = test_layers._ranking_model(  # pylint: disable=protected-access
      user_dynamic=tfde.DynamicConfig(evict_after_steps=3))
  model.compile(optimizer="adam", loss="mse")
  return model


def test_delta_chain_serves_as_a_full_export_without_tfde(tmp_path):
  model = _model()
  x, y = test_layers._ranking_data(384)  # pylint: disable=protected-access
  example = {k: v[:2] for k, v in x.items()}
  model.fit({k: v[:128] for k, v in x.items()}, y[:128], batch_size=32, verbose=0)
  tfde.export_for_serving(model, str(tmp_path / "base"), example)
  deltas, previous, infos = [], tmp_path / "base", []
  for k in range(1, 3):
    part = slice(128 * k, 128 * (k + 1))
    model.fit({n: v[part] for n, v in x.items()}, y[part], batch_size=32, verbose=0)
    deltas.append(str(tmp_path / f"delta{k}"))
    infos.append(tfde.serving.export_delta(model, deltas[-1], base=previous))
    previous = deltas[-1]
  tfde.export_for_serving(model, str(tmp_path / "full"), example)
  # The deltas carry the changed rows only, and the evictions.
  assert all(info["rows"] < 20000 / 10 for info in infos), infos
  removed = [np.asarray(tf.io.parse_tensor(tf.io.read_file(os.path.join(d, "t1.removed")),
                                           tf.int64)) for d in deltas]
  assert sum(r.size for r in removed) > 0  # users evicted after 3 unseen steps

  # Every movie, every user ever seen (evicted ones too) and unseen users.
  users = np.concatenate([np.unique(x["user_id"]), [10**6, -5]])
  movies = np.arange(20000)
  queries = tmp_path / "queries.npz"
  np.savez(queries, user_id=np.resize(users, movies.size), movie_id=movies)
  corrupted = tmp_path / "corrupted"
  shutil.copytree(deltas[-1], corrupted)
  data = bytearray((corrupted / "t0.rows").read_bytes())
  data[-3] ^= 0xFF
  (corrupted / "t0.rows").write_bytes(bytes(data))

  server = tmp_path / "server.py"
  server.write_text(SERVER)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TFDE_OPS")}
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  run = subprocess.run([sys.executable, "-I", str(server), str(tmp_path / "base"),
                        str(tmp_path / "full"), json.dumps(deltas), str(queries),
                        str(corrupted)],
                       capture_output=True, text=True, env=env, cwd="/", timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads([l for l in run.stdout.splitlines() if l.startswith("RESULT")][-1][6:])
  assert result["same_outputs"] and result["same_static_rows"], result
  assert "made for another version" in result["skipping"], result
  assert "fail their fingerprints" in result["corrupted"], result

  # On disk, with tfde's apply_delta: the export becomes the full one.
  for delta in deltas:
    tfde.serving.apply_delta(str(tmp_path / "base"), delta)
  chained = tf.saved_model.load(str(tmp_path / "base"))
  full = tf.saved_model.load(str(tmp_path / "full"))
  q = {k: tf.constant(v) for k, v in np.load(queries).items()}
  np.testing.assert_array_equal(chained.serve(q).numpy(), full.serve(q).numpy())
  np.testing.assert_array_equal(chained.serve(q).numpy(),
                                model.predict(q, batch_size=4096, verbose=0))
