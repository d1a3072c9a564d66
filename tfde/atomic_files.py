"""Replacing a directory so that a reader sees the old one or the new one,
whole, never neither nor a mix: the new version is written beside it,
synced to disk, then exchanged with it in one rename.

>>> import os, tempfile
>>> root = tempfile.mkdtemp()
>>> target, staging = os.path.join(root, "export"), os.path.join(root, ".export.new")
>>> for d, text in ((target, "old"), (staging, "new")):
...   os.makedirs(d)
...   with open(os.path.join(d, "f"), "w") as f:
...     _ = f.write(text)
>>> replace_directory(staging, target)
>>> open(os.path.join(target, "f")).read(), os.path.exists(staging)
('new', False)
"""

import ctypes
import errno
import os
import shutil

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# Where the two-rename fallback keeps the old version while `target` is
# absent; `recover` puts it back after a kill there.
OLD_SUFFIX = ".old"


def fsync_tree(directory):
  """Flushes every file under `directory`, and the directories, to disk."""
  for root, dirs, files in os.walk(directory):
    for name in files:
      fd = os.open(os.path.join(root, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    del dirs
    _fsync_directory(root)


def _fsync_directory(directory):
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _exchange(a, b):
  """Swaps two paths in one step (Linux renameat2 RENAME_EXCHANGE); False
  where the system or the file system cannot."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = libc.renameat2
  except (OSError, AttributeError):
    return False
  renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                        ctypes.c_uint]
  if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
    return False
  raise OSError(code, f"exchanging {a} and {b}: {os.strerror(code)}")


def replace_directory(staging, target):
  """Makes the directory `staging` (synced here first) the directory
  `target`, in one exchange where the system allows it (Linux); elsewhere
  in two renames, between which `target` is briefly absent. The old
  `target` is deleted."""
  fsync_tree(staging)
  if _exchange(staging, target):
    _fsync_directory(os.path.dirname(os.path.abspath(target)) or ".")
    shutil.rmtree(staging)
    return
  old = staging + OLD_SUFFIX
  os.rename(target, old)
  os.rename(staging, target)
  _fsync_directory(os.path.dirname(os.path.abspath(target)) or ".")
  shutil.rmtree(old)


def recover(target, directory, prefix):
  """Puts back the old version a kill between the fallback's two renames
  left aside (`target` absent, `PREFIX...OLD_SUFFIX` beside it)."""
  if os.path.lexists(target) or not os.path.isdir(directory):
    return
  for name in sorted(os.listdir(directory)):
    if name.startswith(prefix) and name.endswith(OLD_SUFFIX):
      os.rename(os.path.join(directory, name), target)
      _fsync_directory(directory)
      return


def remove_stale(directory, prefix):
  """Deletes what killed writers left in `directory`: entries whose name
  starts with `prefix` (after `recover`, never the only copy)."""
  if not os.path.isdir(directory):
    return
  for name in os.listdir(directory):
    if name.startswith(prefix):
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
