"""Delta checkpoints: a full checkpoint every n saves and, in between,
only the table rows changed since the previous save.

>>> import tensorflow as tf, tfde
>>> cfg = tfde.TableConfig(name="t", vocabulary_size=1000, embedding_dim=4,
...                        optimizer="adagrad")
>>> lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=cfg)})
>>> manager = tfde.checkpoint.DeltaCheckpointManager(
...     tf.train.Checkpoint(lookup=lookup), "/tmp/tfde_doc/delta", full_every_n=4)
>>> manager.clear()
>>> _ = manager.save()                      # full
>>> table = lookup.tables["t"]
>>> _ = table.apply_gradient(0, tf.constant([3, 7]), tf.ones([2, 4]))
>>> _ = manager.save()                      # delta: rows 3 and 7 only
>>> [link["kind"] for link in manager.links()]
['full', 'delta']
>>> manager.restore() == manager.latest_checkpoint
True

The directory holds, besides TensorFlow's checkpoint files:

- `delta_checkpoints.json`: the chain, oldest first; per link its number,
  kind ("full" or "delta"), prefix, tables' steps, and every file's size
  and CRC-32;
- per delta link, `<prefix>.index/.data-*`: the checkpoint of everything
  but the tables (dense layers, optimizers, counters), whole; and
  `<prefix>.tables.npz`: per table (by its path in the checkpoint's object
  graph) the arrays of `Table.changes_since`: global ids with their rows,
  slots and counters, ids evicted since, pending ids, step.

Deltas hold global ids, so a chain written with N replicas restores with M.
A link that is missing, truncated or fails its checksum is named in a
warning and the manager restores the last complete state before it (the
links before it in its chain, or the previous chain).
"""

import io
import json
import logging
import os
import zlib

import numpy as np
import tensorflow as tf

from tfde import tf_internals
from tfde.saving import delta_manifest
from tfde.tables import base as tables_base
from tfde.tables import restore_checks

MANIFEST = delta_manifest.MANIFEST
TABLES_SUFFIX = delta_manifest.TABLES_SUFFIX
_KEY_SEPARATOR = delta_manifest.KEY_SEPARATOR

logger = logging.getLogger(__name__)


def file_crc32(path):
  """CRC-32 of a file's bytes, read in chunks."""
  crc = 0
  with tf.io.gfile.GFile(path, "rb") as f:
    while True:
      chunk = f.read(1 << 24)
      if not chunk:
        return crc
      crc = zlib.crc32(chunk, crc)


def describe_files(directory, names):
  """{name: [size, crc32]} of files in `directory`."""
  return {name: [tf.io.gfile.stat(os.path.join(directory, name)).length,
                 file_crc32(os.path.join(directory, name))] for name in names}


def check_files(directory, described):
  """None when every file in `described` ({name: [size, crc32]}) is there
  and whole, else what is wrong with the first that is not."""
  for name, (size, crc) in sorted(described.items()):
    path = os.path.join(directory, name)
    if not tf.io.gfile.exists(path):
      return f"its file {name} is missing"
    if tf.io.gfile.stat(path).length != size:
      return f"its file {name} has {tf.io.gfile.stat(path).length} bytes, not {size}"
    if file_crc32(path) != crc:
      return f"its file {name} fails its CRC-32 check (corrupted)"
  return None


def find_tables(root):
  """{path: table} of the tfde tables reachable from `root` (a checkpoint
  or any trackable), each by its shortest path of attribute names."""
  found, seen, queue = {}, {id(root)}, [("", root)]
  while queue:
    path, obj = queue.pop(0)
    if isinstance(obj, tables_base.Table):
      found[path] = obj
      continue
    for name, child in tf.train.TrackableView(obj).children(obj).items():
      if id(child) not in seen:
        seen.add(id(child))
        queue.append((f"{path}/{name}" if path else name, child))
  return found


def _checkpoint_keys(root):
  """{id(object): its path in checkpoint keys} for every object that
  `root`'s checkpoints hold (`tf_internals.checkpoint_keys`; imported on
  first use, so that only a restore would fail should a release move them:
  tests/unit/test_delta_checkpoint.py restores through them)."""
  return tf_internals.checkpoint_keys(root)


def write_atomically(path, text):
  temporary = path + ".tmp"
  with tf.io.gfile.GFile(temporary, "w") as f:
    f.write(text)
  tf.io.gfile.rename(temporary, path, overwrite=True)


class DeltaCheckpointManager:
  """Saves `checkpoint` to `directory` as chains: one full checkpoint, then
  deltas of the tables' changed rows, for `full_every_n` saves a chain.

  Used like `tf.train.CheckpointManager`: `save()` after some steps,
  `restore()` (not `checkpoint.restore(latest_checkpoint)`: a delta link
  alone holds no whole table) to resume, on any replica count. Build the
  model's tables before `restore()`.

  Args:
    checkpoint: a `tf.train.Checkpoint` (or any trackable) holding the
      model; its tfde tables are found in its object graph at each save.
    directory: where the chains go (one writer per directory: in
      multi-process runs each process calls `save()`, the chief with the
      real directory and the others with their own, as with
      `tf.train.CheckpointManager`).
    full_every_n: saves per chain: 1 writes only full checkpoints.
    max_to_keep: chains kept; older ones are deleted as new ones start.
    checkpoint_name: the links' prefix (`<name>-<number>`).
  """

  def __init__(self, checkpoint, directory, full_every_n=10, max_to_keep=2,
               checkpoint_name="ckpt"):
    if not isinstance(full_every_n, int) or full_every_n < 1:
      raise ValueError(f"full_every_n must be a positive integer, got {full_every_n!r}")
    if not isinstance(max_to_keep, int) or max_to_keep < 1:
      raise ValueError(f"max_to_keep must be a positive integer, got {max_to_keep!r}")
    self._checkpoint = checkpoint
    self._directory = str(directory)
    self._full_every_n = full_every_n
    self._max_to_keep = max_to_keep
    self._name = checkpoint_name
    tf.io.gfile.makedirs(self._directory)
    self._manifest = self._read_manifest()
    # The links' state this process last saw (saved or restored): marks of
    # each table then, and the link they describe.
    self._marks = None
    self._marked_link = None
    # Its name as a consumer of the tables' changes (Table.mark).
    where = self._directory if "://" in self._directory else os.path.abspath(self._directory)
    self.consumer = f"DeltaCheckpointManager:{where}"

  @property
  def directory(self):
    return self._directory

  # ---- the chain on disk

  def _read_manifest(self):
    # An unreadable record is rebuilt from the files once the model's
    # tables are known (the next save or restore: _checked_manifest).
    manifest, self._manifest_problem = delta_manifest.read(self._directory)
    return manifest if manifest is not None else delta_manifest.empty()

  def _checked_manifest(self):
    """Checks the record against the links' files; rebuilds it from them,
    warning with the reason, when it fails or could not be read."""
    tables = find_tables(self._checkpoint)
    keys = _checkpoint_keys(self._checkpoint)
    table_keys = {p: keys[id(t)] for p, t in tables.items()}
    problem = self._manifest_problem or delta_manifest.problem(
        self._manifest, self._directory, table_keys)
    if problem is None:
      return
    logger.warning("tfde: %s: %s; rebuilding it from the checkpoint files",
                   os.path.join(self._directory, MANIFEST), problem)
    self._manifest, left_out = delta_manifest.rebuild(self._directory, self._name,
                                                      table_keys, describe_files)
    self._manifest_problem = None
    # A record that leaves links out stays in memory only: written, it
    # would lose them for a model that reads them.
    if not left_out:
      self._write_manifest()
    self._marks = self._marked_link = None

  def _write_manifest(self):
    write_atomically(os.path.join(self._directory, MANIFEST),
                     json.dumps(self._manifest, indent=1))

  def links(self):
    """The links on record, oldest first (dicts: number, kind, prefix,
    steps, files, bytes)."""
    return [dict(link) for link in self._manifest["links"]]

  def _path(self, link):
    return os.path.join(self._directory, link["prefix"])

  @property
  def latest_checkpoint(self):
    """The newest link's prefix, or None."""
    links = self._manifest["links"]
    return self._path(links[-1]) if links else None

  @property
  def checkpoints(self):
    """Every link's prefix, oldest first."""
    return [self._path(link) for link in self._manifest["links"]]

  def _chains(self, links=None):
    chains = []
    for link in self._manifest["links"] if links is None else links:
      if link["kind"] == "full" or not chains:
        chains.append([])
      chains[-1].append(link)
    return chains

  def _delete(self, links):
    for link in links:
      for name in link["files"]:
        path = os.path.join(self._directory, name)
        if tf.io.gfile.exists(path):
          tf.io.gfile.remove(path)

  def clear(self):
    """Deletes every link and the record of them."""
    self._delete(self._manifest["links"])
    self._manifest = delta_manifest.empty()
    self._manifest_problem = None
    self._write_manifest()
    self._marks = self._marked_link = None

  def release(self):
    """This manager asks the tables for no more changes (its next save is
    full): what only it kept of their record of evictions is dropped."""
    for table in find_tables(self._checkpoint).values():
      table.drop_consumer(self.consumer)
    self._marks = self._marked_link = None

  # ---- saving

  def _continues_chain(self, tables):
    links = self._manifest["links"]
    if not links or self._marks is None or self._marked_link != links[-1]["prefix"]:
      return False
    if len(self._chains()[-1]) >= self._full_every_n:
      return False
    return (set(self._marks) == set(tables) and
            all(self._marks[p].lineage == t.lineage for p, t in tables.items()))

  def _changes(self, tables):
    """Each table's changes since this manager's marks, or None (with a
    warning naming why) when one cannot say them: its record of evictions
    passed its bound while this manager lagged. The save is then full."""
    try:
      return {p: t.changes_since(self._marks[p], self.consumer) for p, t in tables.items()}
    except ValueError as e:
      logger.warning("tfde: %s; %s saves a full checkpoint instead", e, self._directory)
      return None

  def save(self, checkpoint_number=None):
    """Writes a link: a delta of the changes since the previous save when
    this process wrote or restored that one and the chain has room, else a
    full checkpoint. Returns its prefix."""
    if self._manifest_problem:
      self._checked_manifest()
    number = int(checkpoint_number or self._manifest["next_number"])
    links = self._manifest["links"]
    if links and number <= max(link["number"] for link in links):
      # Links are ordered by number (restore drops the later ones): a
      # smaller one would be taken for an older link.
      raise ValueError(
          f"checkpoint number {number} does not increase: {self._directory} already "
          f"holds link {max(link['number'] for link in links)}; save with a larger "
          "number (or none)")
    prefix = f"{self._name}-{number}"
    if any(link["prefix"] == prefix for link in self._manifest["links"]):
      raise ValueError(f"checkpoint {prefix} already exists in {self._directory}")
    tables = find_tables(self._checkpoint)
    path = os.path.join(self._directory, prefix)
    changes = self._changes(tables) if self._continues_chain(tables) else None
    if changes is not None:
      kind = "delta"
      # The rows first: a link on record always has its files.
      buffer = io.BytesIO()
      np.savez(buffer, **{f"{p}{_KEY_SEPARATOR}{key}": np.asarray(value)
                          for p, c in changes.items() for key, value in c.items()})
      with tf.io.gfile.GFile(path + TABLES_SUFFIX, "wb") as f:
        f.write(buffer.getvalue())
      with tables_base.tables_left_out():
        self._checkpoint.write(path)
    else:
      kind = "full"
      self._checkpoint.write(path)
    marks = {p: t.mark(self.consumer) for p, t in tables.items()}
    # The next link is a delta of this one, or a new chain: this manager
    # asks for nothing older (other consumers keep what they need).
    for p, t in tables.items():
      t.forget_changes_before(marks[p].step, self.consumer)
    names = sorted(n for n in tf.io.gfile.listdir(self._directory)
                   if n.startswith(prefix + ".") and not n.endswith(".tmp"))
    files = describe_files(self._directory, names)
    link = {"number": number, "kind": kind, "prefix": prefix,
            "steps": {p: m.step for p, m in marks.items()}, "files": files,
            "bytes": sum(size for size, _ in files.values())}
    self._manifest["links"].append(link)
    self._manifest["next_number"] = max(self._manifest["next_number"], number + 1)
    chains = self._chains()
    dropped = [l for chain in chains[:-self._max_to_keep] for l in chain]
    self._manifest["links"] = [l for chain in chains[-self._max_to_keep:] for l in chain]
    self._write_manifest()
    self._delete(dropped)
    self._marks, self._marked_link = marks, prefix
    return path

  # ---- restoring

  def _problem(self, link):
    return check_files(self._directory, link["files"])

  def _complete_prefix(self, chain):
    """The longest run of sound links from the chain's start; warns about
    the first broken one."""
    sound = []
    for link in chain:
      problem = self._problem(link)
      if problem:
        fallback = (f"restoring {sound[-1]['prefix']}, the last complete state"
                    if sound else "falling back to the previous chain")
        logger.warning("tfde: checkpoint link %s (%s) is unusable: %s; %s",
                       self._path(link), link["kind"], problem, fallback)
        break
      sound.append(link)
    return sound

  def restore(self, save_path=None):
    """Restores the latest complete state (or the chain up to link
    `save_path`): the chain's full checkpoint, then each delta's changes,
    then the rest of the model from the last link. Returns the prefix
    restored, or None when no link could be. Links after the one restored
    are dropped, and the next save continues its chain. The record of
    links is checked against their files first (`tfde.delta_manifest`)."""
    self._checked_manifest()
    links = self._manifest["links"]
    if save_path is not None:
      prefixes = [self._path(l) for l in links]
      if str(save_path) not in prefixes:
        raise ValueError(f"{save_path} is not a link of {self._directory} "
                         f"(links: {prefixes})")
      links = links[:prefixes.index(str(save_path)) + 1]
    for chain in reversed(self._chains(links)):
      sound = self._complete_prefix(chain)
      if not sound or sound[0]["kind"] != "full":
        continue
      self._restore_chain(sound)
      later = [l for l in self._manifest["links"]
               if l["number"] > sound[-1]["number"]]
      if later:
        logger.warning("tfde: dropping the links after %s: %s",
                       self._path(sound[-1]), [l["prefix"] for l in later])
        self._manifest["links"] = [l for l in self._manifest["links"]
                                   if l not in later]
        self._write_manifest()
        self._delete(later)
      return self._path(sound[-1])
    if links:
      logger.warning("tfde: no complete checkpoint in %s; nothing restored",
                     self._directory)
    return None

  def _restore_chain(self, chain):
    tables = find_tables(self._checkpoint)
    # All of the chain is read and checked before the model changes: one
    # that does not fit it (another model's tables, a delta of another
    # shape) is refused with the live tables as they were.
    self._check_holds_tables(chain[0], tables)
    keys = _checkpoint_keys(self._checkpoint)
    restore_checks.check_tables_in_checkpoint(
        self._path(chain[0]), tables, {p: keys[id(t)] for p, t in tables.items()})
    deltas = [self._read_changes(link, tables) for link in chain[1:]]
    for link, changes in zip(chain[1:], deltas):
      for table_path, table in tables.items():
        try:
          table.check_changes(changes[table_path])
        except ValueError as e:
          raise ValueError(f"checkpoint link {self._path(link)}: {e}") from None
    self._checkpoint.read(self._path(chain[0])).expect_partial()
    for changes in deltas:
      for table_path, table in tables.items():
        table.apply_changes(changes[table_path])
    if len(chain) > 1:
      with tables_base.tables_left_out():
        self._checkpoint.read(self._path(chain[-1])).expect_partial()
    self._marks = {p: t.mark(self.consumer) for p, t in tables.items()}
    self._marked_link = chain[-1]["prefix"]

  def _check_holds_tables(self, link, tables):
    """Refuses a full link that lacks any of the model's tables (a read of
    it would restore the others and leave those as they are)."""
    held = {name.partition("/.ATTRIBUTES/")[0]
            for name, _ in tf.train.list_variables(self._path(link))}
    keys = _checkpoint_keys(self._checkpoint)
    missing = sorted(p for p, t in tables.items() if keys.get(id(t)) not in held)
    if missing:
      raise ValueError(
          f"checkpoint link {self._path(link)} lacks the tables {missing} of the "
          "model (it was written by another model); nothing was restored")

  def _read_changes(self, link, tables):
    changes = {}
    with tf.io.gfile.GFile(self._path(link) + TABLES_SUFFIX, "rb") as f:
      data = io.BytesIO(f.read())
    with np.load(data) as arrays:
      for key in arrays.files:
        table_path, field = key.rsplit(_KEY_SEPARATOR, 1)
        changes.setdefault(table_path, {})[field] = arrays[key]
    if set(changes) != set(tables):
      raise ValueError(
          f"checkpoint link {self._path(link)} holds the tables "
          f"{sorted(changes)}, the model {sorted(tables)} (build the model's "
          "tables before restoring)")
    return changes
