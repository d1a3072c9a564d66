"""Smoke test of an installed tfde wheel (run by `make wheel-test` in a
fresh virtual environment, from outside the source tree).

Checks: tfde imports from the environment, not the checkout; its op
library is the compiled one and was built for this TensorFlow; a lookup
and a training step run on the kernels; the `tfde` command answers; and
another TensorFlow minor version is refused at import with a message
naming both versions and the fix.
"""

import os
import subprocess
import sys


def main():
  import tensorflow as tf

  import tfde
  from tfde import _build_info
  from tfde import ops
  here = os.path.dirname(tfde.__file__)
  assert "site-packages" in here, f"tfde imported from {here}, not the environment"
  assert _build_info.TENSORFLOW_VERSION == tf.__version__, (
      _build_info.TENSORFLOW_VERSION, tf.__version__)
  assert os.path.exists(os.path.join(here, "ops", "_tfde_ops.so"))
  assert ops.kernels_available() and ops.current_backend() == "kernels", ops.current_backend()

  table = tfde.TableConfig(name="t", vocabulary_size=100, embedding_dim=4,
                           optimizer="adagrad")
  layer = tfde.layers.DistributedEmbedding({"f": tfde.FeatureConfig(name="f", table=table)})
  ids = tf.constant([[1, 2], [3, 99]])
  before = layer.get_embedding_tables()["t"].numpy()
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layer({"f": ids}, training=True)["f"])
  tape.gradient(loss, layer.trainable_variables)
  after = layer.get_embedding_tables()["t"].numpy()
  changed = sorted(set((before != after).any(axis=1).nonzero()[0].tolist()))
  assert changed == [1, 2, 3, 99], changed

  command = os.path.join(os.path.dirname(sys.executable), "tfde")
  result = subprocess.run([command, "--help"], capture_output=True, text=True)
  assert result.returncode == 0 and "tfde train" in result.stdout, result

  # Another minor version: refused when tfde first loads TensorFlow's side
  # (`import tfde` alone is lazy), naming both and the fix.
  info = os.path.join(here, "_build_info.py")
  original = open(info).read()
  try:
    with open(info, "w") as f:
      f.write("TENSORFLOW_VERSION = '2.20.0'\n")
    result = subprocess.run([sys.executable, "-c", "import tfde; tfde.lookup"], capture_output=True,
                            text=True, cwd="/")
  finally:
    with open(info, "w") as f:
      f.write(original)
  assert result.returncode != 0
  message = result.stderr.strip().splitlines()[-1]
  assert "2.20.0" in message and tf.__version__ in message and "pip install" in message, message
  print(f"wheel smoke test passed: tfde {tfde.__version__} on TensorFlow {tf.__version__} "
        f"({here})")


if __name__ == "__main__":
  main()
