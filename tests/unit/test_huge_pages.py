"""tfde asks Linux for transparent huge pages under large CPU tables
(`tfde.ops.advise_huge_pages`, kernels/huge_pages_op.cc): checked against
the kernel's own accounting (AnonHugePages in /proc/self/smaps_rollup), and
the values must never change."""

import numpy as np
import pytest
import tensorflow as tf

import tfde
import tfde.ops
import tfde.tables

MIB = 1 << 20
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_mode():
  """The kernel's THP mode ("always", "madvise", "never"), or None."""
  try:
    with open(THP) as f:
      return f.read().split("[")[1].split("]")[0]
  except (OSError, IndexError):
    return None


def _mappings(variable):
  """The mappings over `variable`'s buffer, from /proc/self/smaps: (bytes
  of the buffer in it, its bytes in huge pages, whether it is advised for
  huge pages: VmFlags "hg") of each. The advice splits a mapping at the
  buffer's whole 2 MiB pages, and the kernel merges neighbours advised
  alike, so a mapping may reach past the buffer."""
  value = np.asarray(variable.read_value())  # the buffer itself, not a copy
  start = value.__array_interface__["data"][0]
  end = start + value.nbytes
  found, current = [], None
  with open("/proc/self/smaps") as f:
    for line in f:
      head = line.split()[0]
      if "-" in head and all(c in "0123456789abcdef-" for c in head):
        lo, hi = (int(x, 16) for x in head.split("-"))
        current = [min(hi, end) - max(lo, start), 0, False] if lo < end and hi > start else None
        if current:
          found.append(current)
      elif current and head == "AnonHugePages:":
        current[1] = min(current[0], int(line.split()[1]) * 1024)
      elif current and head == "VmFlags:":
        current[2] = "hg" in line.split()[1:]
  return found


def _advised_bytes(variable):
  return sum(size for size, _, advised in _mappings(variable) if advised)


def _huge_bytes(variable):
  """At most the buffer's bytes in huge pages (a mapping reaching past the
  buffer counts no more than its part of the buffer)."""
  return sum(huge for _, huge, _ in _mappings(variable))


needs_thp = pytest.mark.skipif(
    _thp_mode() not in ("always", "madvise"),
    reason=f"transparent huge pages are off here ({THP}: {_thp_mode()})")


@pytest.fixture(autouse=True)
def _kernels():
  if not tfde.ops.kernels_available():
    pytest.fail(f"tfde's op library did not load: {tfde.ops.native.load_error()}")


@needs_thp
def test_a_large_variable_moves_to_huge_pages_and_keeps_its_values():
  with tf.device("/cpu:0"):
    variable = tf.Variable(tf.random.stateless_uniform([300_000, 64], seed=[1, 2]))
  before = variable.numpy().copy()
  advised, collapsed = [int(x) for x in tfde.ops.advise_huge_pages([variable])]
  # The whole 2 MiB pages inside the 73 MiB buffer: all but its two ends.
  assert before.nbytes - 4 * MIB <= advised <= before.nbytes
  np.testing.assert_array_equal(variable.numpy(), before)
  if collapsed == 0:
    pytest.skip("this kernel has no MADV_COLLAPSE (Linux 6.1): advised only")
  assert collapsed == advised
  # The kernel's own account of that buffer.
  assert _advised_bytes(variable) >= advised
  assert _huge_bytes(variable) >= collapsed


@needs_thp
def test_variables_on_several_cpus_are_advised_each_where_it_lives():
  """MirroredStrategy over logical CPUs holds a table per replica, each on
  its own device: the advice was one op for all, which TensorFlow cannot
  place (the sharded bench's N = 2 failed so)."""
  variables = []
  for device in ("/cpu:0", "/cpu:1"):
    with tf.device(device):
      variables.append(tf.Variable(tf.random.stateless_uniform([300_000, 64], seed=[1, 2])))
  before = [v.numpy().copy() for v in variables]
  advised, _ = [int(x) for x in tfde.ops.advise_huge_pages(variables)]
  assert sum(b.nbytes for b in before) - 8 * MIB <= advised <= sum(b.nbytes for b in before)
  for variable, values in zip(variables, before):
    assert _advised_bytes(variable) >= values.nbytes - 4 * MIB
    np.testing.assert_array_equal(variable.numpy(), values)


def test_small_and_switched_off_variables_are_left_alone(monkeypatch):
  small = tf.Variable(tf.zeros([100, 8]))
  assert [int(x) for x in tfde.ops.advise_huge_pages([small])] == [0, 0]
  with tf.device("/cpu:0"):
    large = tf.Variable(tf.zeros([tfde.ops.HUGE_PAGES_MIN_BYTES // 4]))
  monkeypatch.setenv("TFDE_HUGE_PAGES", "0")
  assert [int(x) for x in tfde.ops.advise_huge_pages([large])] == [0, 0]


def test_the_twin_advises_nothing_and_changes_nothing():
  with tf.device("/cpu:0"):
    variable = tf.Variable(tf.ones([tfde.ops.HUGE_PAGES_MIN_BYTES // 4]))
  with tfde.ops.backend(tfde.ops.REFERENCE):
    assert [int(x) for x in tfde.ops.advise_huge_pages([variable])] == [0, 0]
  assert float(tf.reduce_min(variable)) == 1.0


def test_an_uninitialized_variable_is_an_error_not_a_crash():
  with tf.Graph().as_default(), tf.device("/cpu:0"):
    variable = tf.Variable(tf.zeros([tfde.ops.HUGE_PAGES_MIN_BYTES // 4]))
    advice = tfde.ops.native.advise_huge_pages([variable])
    with tf.compat.v1.Session() as session:
      # Before the initializer: the resource does not exist yet, or is
      # not initialized; either way a named error.
      with pytest.raises((tf.errors.FailedPreconditionError, tf.errors.NotFoundError)):
        session.run(advice)
      session.run(variable.initializer)
      advised, _ = session.run(advice)
      whole_pages = tfde.ops.HUGE_PAGES_MIN_BYTES - 4 * MIB
      assert advised >= whole_pages if _thp_mode() in ("always", "madvise") else advised == 0


@needs_thp
def test_a_table_advises_its_rows_and_slots_when_made_and_after_a_load():
  config = tfde.TableConfig(name="big", vocabulary_size=200_000, embedding_dim=64,
                            optimizer=tfde.optimizers.Adam(learning_rate=0.01))
  table = tfde.tables.make_table(config, tfde.comm.LocalCommunicator("/cpu:0"))
  buffers = [table.shards[0], *table.slots[0].values()]  # rows, m and v
  whole_pages = 200_000 * 64 * 4 - 4 * MIB  # each buffer but its two ends
  # Advised (whether the kernel found free huge pages to move them to at
  # once is its own affair: MADV_COLLAPSE may find none).
  for variable in buffers:
    assert _advised_bytes(variable) >= whole_pages
  state = {key: np.asarray(value) for key, value in table.state().items()}
  # A load gives the variables new buffers; they are advised again.
  new_rows = state["table"] + 1.0
  table.load_state(dict(state, table=new_rows))
  np.testing.assert_array_equal(table.full_table(), new_rows)
  for variable in buffers:
    assert _advised_bytes(variable) >= whole_pages
  for key in state:
    if key not in ("table", "step"):
      np.testing.assert_array_equal(np.asarray(table.state()[key]), state[key])



def test_a_tf1_graph_load_adds_no_advice(monkeypatch):
  # In a TF1 graph a restore's op runs before the variables it leaves out
  # (the update record) are initialized: advising them there would fail.
  monkeypatch.setattr(tfde.ops, "HUGE_PAGES_MIN_BYTES", 1)  # every variable
  with tf.Graph().as_default():
    table = tfde.tables.make_table(
        tfde.TableConfig(name="g", vocabulary_size=10, embedding_dim=4),
        tfde.comm.LocalCommunicator("/cpu:0"))
    table.load_state({"table": tf.zeros([10, 4]), "step": tf.constant(0, tf.int64)})
    ops = tf.compat.v1.get_default_graph().get_operations()
    assert ops and not [op for op in ops if op.type == "TfdeAdviseHugePages"]


def test_a_table_kind_cannot_bypass_the_load_advice():
  with pytest.raises(TypeError, match="overrides load_state"):
    class _Kind(tfde.tables.Table):  # pylint: disable=unused-variable
      def load_state(self, state, source="checkpoint"):
        return None
