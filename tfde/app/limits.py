"""What a `tfde train` job can ask of this machine, checked before any work,
and the one line a full disk gets.

The rule for sizes: the job's tables (rows alone: vocabulary_size x
embedding_dim float32, without optimizer slots) and its generated data
(per sample: 8 bytes an id at full hotness, 4 a dense feature, 4 the
label) must each fit in this machine's physical memory. Both are lower
bounds of what training holds, so a job refused here could never run;
one that passes may still be too big with slots and copies, which
TensorFlow then reports.

>>> human_bytes(3 << 30)
'3.0 GiB'
"""

import errno
import os
import re

from tfde.app.config import ConfigError

FLOAT_BYTES, ID_BYTES = 4, 8


def physical_memory_bytes():
  """This machine's physical memory, or None where the OS does not say."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def human_bytes(n):
  for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
    if n < 1024 or unit == "PiB":
      return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
    n /= 1024


def check_fits_memory(config, config_file=None, memory=None):
  """Raises ConfigError naming the key (the largest table's
  vocabulary_size, or data.train_samples) when the job's tables or its
  generated data alone exceed `memory` (default: physical memory)."""
  memory = physical_memory_bytes() if memory is None else memory
  if not memory:
    return
  d, dim = config.data, config.model.embedding_dim
  features = list(enumerate(d.sparse_features))
  if features:
    table_bytes = sum(f.vocabulary_size * dim * FLOAT_BYTES for _, f in features)
    i, largest = max(features, key=lambda item: item[1].vocabulary_size)
    if table_bytes > memory:
      raise ConfigError(
          f"data.sparse_features[{i}].vocabulary_size",
          f"too large for this machine: the tables' rows alone (vocabulary_size x "
          f"embedding_dim {dim} x 4 bytes, summed over the features) take "
          f"{human_bytes(table_bytes)}, and it has {human_bytes(memory)} of memory; "
          f"got {largest.vocabulary_size}", file=config_file)
  if d.kind == "synthetic":
    per_sample = (sum(f.hotness for f in d.sparse_features) * ID_BYTES +
                  (d.dense_features + 1) * FLOAT_BYTES)
    data_bytes = (d.train_samples + d.eval_samples) * per_sample
    if data_bytes > memory:
      raise ConfigError(
          "data.train_samples",
          f"too large for this machine: the generated samples alone "
          f"({per_sample} bytes each) take {human_bytes(data_bytes)}, and it has "
          f"{human_bytes(memory)} of memory; got {d.train_samples}", file=config_file)


def disk_full(error):
  """The one line for `error` if it is a full disk (ENOSPC, or TensorFlow's
  "No space left on device"), else None."""
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
    where = error.filename or "the report folder"
    return f"disk full while writing {where}: {os.strerror(error.errno)}"
  text = str(error)
  for reason in ("No space left on device", "Disk quota exceeded"):
    if reason in text:
      # TensorFlow's: "{{function_node ...}} /path/file.tempstate123; No
      # space left on device [Op:SaveV2]"
      path = re.search(r"(/[^\s;:]+)[;:]?\s*" + reason, text)
      where = re.sub(r"\.tempstate\d+$", "", path.group(1)) if path else "the report folder"
      return f"disk full while writing {where}: {reason}"
  return None
