"""The record of a `DeltaCheckpointManager`'s chains (`delta_checkpoints.json`),
checked against the checkpoint files before it is trusted.

A link's entry says which table steps it holds; its files say so too (a
delta's `<prefix>.tables.npz` per table, a full checkpoint its tables'
`step` tensors). Entries must agree with their files, numbers must
increase down the record, and within a chain the steps must not go back.
A record that fails (links swapped, entries edited) or cannot be parsed
(truncated) is rebuilt from the files, with a warning naming the file; a
chain the files themselves cannot order is refused by name.
"""

import json
import logging
import os
import re

import numpy as np
import tensorflow as tf

MANIFEST = "delta_checkpoints.json"
TABLES_SUFFIX = ".tables.npz"
KEY_SEPARATOR = "|"

logger = logging.getLogger(__name__)


def empty():
  return {"next_number": 1, "links": []}


def read(directory):
  """(the record, None), or (None, why it cannot be read) for a record that
  is not well-formed JSON of the expected shape."""
  path = os.path.join(directory, MANIFEST)
  if not tf.io.gfile.exists(path):
    return empty(), None
  try:
    with tf.io.gfile.GFile(path) as f:
      manifest = json.load(f)
    if not isinstance(manifest.get("next_number"), int):
      raise ValueError("its next_number is not an integer")
    for link in manifest["links"]:
      if (not isinstance(link["number"], int) or link["kind"] not in ("full", "delta")
          or not isinstance(link["prefix"], str) or not isinstance(link["steps"], dict)
          or not isinstance(link["files"], dict)):
        raise ValueError(f"its entry {link!r} is malformed")
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return None, f"{path} cannot be read ({type(e).__name__}: {e})"
  return manifest, None


def file_steps(directory, prefix, kind, table_keys):
  """{table path: step} as link `prefix`'s own files hold them;
  `table_keys` maps each table path to its key in full checkpoints. None
  when the files are missing or unreadable (the link is broken: the
  manager names it when restoring)."""
  path = os.path.join(directory, prefix)
  try:
    if kind == "delta":
      with tf.io.gfile.GFile(path + TABLES_SUFFIX, "rb") as f:
        import io  # pylint: disable=g-import-not-at-top
        with np.load(io.BytesIO(f.read())) as arrays:
          return {p: int(arrays[f"{p}{KEY_SEPARATOR}step"]) for p in table_keys}
    reader = tf.train.load_checkpoint(path)
    return {p: int(reader.get_tensor(f"{key}/.ATTRIBUTES/step"))
            for p, key in table_keys.items()}
  except Exception:  # pylint: disable=broad-except
    return None


def problem(manifest, directory, table_keys):
  """None when every link's entry agrees with its files and the record is
  ordered, else what is wrong first."""
  previous = None
  for link in manifest["links"]:
    if previous is not None and link["number"] <= previous["number"]:
      return (f"link {link['prefix']} comes after {previous['prefix']} (numbers must "
              "increase)")
    held = file_steps(directory, link["prefix"], link["kind"], table_keys)
    if held is not None and any(link["steps"].get(p) != s for p, s in held.items()):
      return (f"link {link['prefix']} says it holds the steps {link['steps']}, its files "
              f"{held}")
    if (previous is not None and link["kind"] == "delta" and
        any(link["steps"].get(p, 0) < previous["steps"].get(p, 0) for p in table_keys)):
      return f"delta link {link['prefix']} goes back in steps from {previous['prefix']}"
    previous = link
  return None


def rebuild(directory, name, table_keys, describe_files):
  """The record as the files of `<name>-<number>` links in `directory` say
  it: links by number, a delta where `<prefix>.tables.npz` exists, steps
  from the files, and the links it left out as unreadable. Raises
  ValueError naming a delta link whose steps go back from the link before
  it (the files cannot say what it continues), or when no link at all
  reads with these tables (another model's checkpoints)."""
  pattern = re.compile(re.escape(name) + r"-(\d+)\.index$")
  numbers = sorted(int(m.group(1)) for m in map(pattern.match, tf.io.gfile.listdir(directory))
                   if m)
  links, left_out, previous = [], [], None
  for number in numbers:
    prefix = f"{name}-{number}"
    kind = "delta" if tf.io.gfile.exists(os.path.join(directory, prefix + TABLES_SUFFIX)) \
        else "full"
    steps = file_steps(directory, prefix, kind, table_keys)
    if steps is None:
      logger.warning("tfde: checkpoint link %s is unreadable; left out of the "
                     "rebuilt record", os.path.join(directory, prefix))
      left_out.append(prefix)
      continue
    if (kind == "delta" and previous is not None and
        any(steps[p] < previous["steps"][p] for p in table_keys)):
      raise ValueError(
          f"checkpoint link {os.path.join(directory, prefix)} holds the steps {steps}, "
          f"before those of {previous['prefix']} ({previous['steps']}): the chain "
          f"cannot be ordered from its files and {MANIFEST} is not to be trusted; "
          "nothing was restored")
    names = sorted(n for n in tf.io.gfile.listdir(directory)
                   if n.startswith(prefix + ".") and not n.endswith(".tmp"))
    files = describe_files(directory, names)
    previous = {"number": number, "kind": kind, "prefix": prefix, "steps": steps,
                "files": files, "bytes": sum(size for size, _ in files.values())}
    links.append(previous)
  if numbers and not links:
    raise ValueError(
        f"no checkpoint link in {directory} reads with this model's tables "
        f"({sorted(table_keys)}): checkpoints of another model? {MANIFEST} is left "
        "as it is and nothing was restored")
  return {"next_number": (numbers[-1] + 1) if numbers else 1, "links": links}, left_out
