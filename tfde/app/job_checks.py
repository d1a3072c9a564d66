"""What `tfde train` and `tfde plan` check before any work, and before
TensorFlow loads (a few seconds): the whole config against its schema, the
data file, the report folder, the options. A problem is a `ConfigError`
naming the file and the key, which the command prints as one line.

>>> import argparse
>>> args = argparse.Namespace(config="no/such.yaml", data=None, report_dir=None)
>>> train_job(args)
Traceback (most recent call last):
tfde.app.config.ConfigError: no/such.yaml: cannot read the config: No such file or directory
"""

import os
import tempfile

from tfde.app import limits
from tfde.app import plan_command
from tfde.app.config import ConfigError
from tfde.app.config import load_config


def check_paths(config, config_file, data_path=None, report_dir=None):
  """Before any work: the data file can be read and the report folder
  written (it is created). Raises ConfigError naming the option or key."""
  if data_path is not None:
    _check_readable(data_path, "--data", None)
  elif config.data.kind == "movielens":
    _check_readable(config.data.path, "data.path", config_file)
  if report_dir is not None:
    _check_writable(report_dir, "--report-dir", None)
  else:
    _check_writable(config.report_dir, "report_dir", config_file)


def _check_readable(path, key, config_file):
  try:
    with open(path, "rb"):
      pass
  except OSError as e:
    raise ConfigError(key, f"cannot read {path!r}: {e.strerror or e}",
                      file=config_file) from None


def _check_writable(path, key, config_file):
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(key, f"{path!r} is a file, not a folder", file=config_file)
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise ConfigError(key, f"cannot write to {path!r}: {e.strerror or e}",
                      file=config_file) from None


def train_job(args):
  """The config of `tfde train ARGS`, checked with its paths and options."""
  config = load_config(args.config)
  check_paths(config, args.config, args.data, args.report_dir)
  if getattr(args, "delta_every", 0) < 0:
    raise ConfigError("--delta-every", f"must be >= 0, got {args.delta_every}")
  plan_path = getattr(args, "plan", None)
  if plan_path:
    _check_readable(plan_path, "--plan", args.config)
  limits.check_fits_memory(config, args.config)
  return config


def plan_job(args):
  """(the config, the memory per replica in bytes or None) of `tfde plan
  ARGS`, checked with its paths and options."""
  config = load_config(args.config)
  memory = None
  if args.memory_per_replica is not None:
    try:
      memory = plan_command.parse_bytes(args.memory_per_replica)
    except ValueError as e:
      raise ConfigError("--memory-per-replica", str(e)) from None
  if args.replicas is not None and args.replicas < 1:
    raise ConfigError("--replicas", f"must be >= 1, got {args.replicas}")
  check_paths(config, args.config, args.data, args.report_dir)
  return config, memory


def checked_job(args):
  """What `train_job` or `plan_job` gives for `args.command`."""
  return (train_job if args.command == "train" else plan_job)(args)
