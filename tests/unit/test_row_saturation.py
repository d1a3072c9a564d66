"""bfloat16/float16 rows saturate: a finite update beyond the row type's
range stores its largest finite value (sign kept), never inf, and counts
in `skipped_updates` like a skipped non-finite update; warm_start refuses
such values by name."""

import numpy as np
import pytest
import tensorflow as tf

import tfde


def _table(dtype, name="h"):
  config = tfde.TableConfig(name=name, vocabulary_size=4, embedding_dim=2, dtype=dtype,
                            optimizer=tfde.optimizers.SGD(learning_rate=1.0))
  table = tfde.tables.ShardedTable(config)
  table.load_state({"table": np.full((4, 2), 60000.0, np.float32),
                    "step": np.asarray(0, np.int64)})
  return table


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_finite_step_beyond_range_saturates_and_counts(dtype):
  table = _table(dtype)
  largest = float(tf.as_dtype(dtype).max)
  before = table.full_table().astype(np.float64)
  # Row 1 leaves float16's range; row 2 leaves both (float32 holds 3.4e38,
  # bfloat16's largest is 3.39e38).
  grad = np.array([[-1e4, 1e4], [-3.4e38, 0.0]], np.float32)
  table.apply_gradient(0, tf.constant([1, 2]), tf.constant(grad))
  got = table.full_table().astype(np.float64)
  # Numpy oracle: w - lr * g in float64, clipped to the type's range, then
  # (for values inside it) within one spacing of the float32 result.
  want = np.clip(before[[1, 2]] - grad, -largest, largest)
  assert np.isfinite(got).all(), got
  np.testing.assert_allclose(got[[1, 2]], want, rtol=2**-7)
  saturated = np.abs(before[[1, 2]] - grad) > largest
  np.testing.assert_array_equal(np.abs(got[[1, 2]])[saturated], largest)
  np.testing.assert_array_equal(got[[0, 3]], before[[0, 3]])
  assert saturated.any()
  assert table.skipped_updates() == 1


def test_float16_step_inside_range_is_not_counted():
  table = _table("float16")
  table.apply_gradient(0, tf.constant([0]), tf.constant([[1.0, -1.0]]))
  assert table.skipped_updates() == 0
  assert np.isfinite(table.full_table()).all()


def test_float16_overflow_counts_each_update():
  table = _table("float16")
  for _ in range(2):
    table.apply_gradient(0, tf.constant([3]), tf.constant([[-1e4, 0.0]]))
  assert table.full_table()[3, 0] == 65504.0
  assert table.skipped_updates() == 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_warm_start_beyond_range_is_refused(dtype):
  table = _table(dtype, name=f"w{dtype}")
  source = np.zeros((4, 2), np.float32)
  source[2, 1] = 7e4 if dtype == "float16" else 3.4e38
  before = table.full_table()
  with pytest.raises(ValueError, match=rf"table 'w{dtype}': warm_start value .* row 2, "
                     rf"column 1 .*{dtype}"):
    tfde.checkpoint.warm_start(table, source)
  np.testing.assert_array_equal(table.full_table(), before)  # nothing written
  source[2, 1] = 1.0
  tfde.checkpoint.warm_start(table, source)
  np.testing.assert_array_equal(table.full_table(), source)
