"""The `tfde` command: its arguments and help, answered without TensorFlow.

Parsing, `--help` and argument errors need only the standard library
(`import tfde` and `tfde.app` load nothing else), and a job's config and
files are checked without TensorFlow (`tfde.app.job_checks`); TensorFlow
and the op library (a few seconds) load only once a subcommand runs
(`tfde.app.cli` for `train` and `plan`, `tfde.app.inspect` for
`inspect`), quietly unless `--verbose`. `python -m tfde.app` runs it too.

>>> parser = build_parser()
>>> args = parser.parse_args(["train", "--config", "configs/demo.yaml"])
>>> args.command, args.config, args.verbose
('train', 'configs/demo.yaml', False)
"""

import argparse
import contextlib
import os
import sys

TRAIN_EXAMPLES = """\
examples:
  tfde train --config configs/demo.yaml
  tfde train --config configs/demo.yaml --data ../shared/data/ml-latest-small/ratings.csv
  tfde train --config configs/demo.yaml --projector site   # then: tensorboard --logdir reports/demo/tensorboard
"""

INSPECT_EXAMPLES = """\
examples:
  tfde inspect reports/demo/checkpoint
  tfde inspect reports/demo/checkpoint --hot 10 --plot reports/demo/inspect
  tfde inspect exported_model/            # a SavedModel from tfde.export_for_serving
"""

PLAN_EXAMPLES = """\
examples:
  tfde plan --config configs/demo.yaml
  tfde plan --config configs/demo.yaml --replicas 4 --memory-per-replica 64MiB
"""

MAIN_EXAMPLES = """\
examples:
  tfde train --config configs/demo.yaml
  tfde inspect reports/demo/checkpoint --hot 10
  tfde plan --config configs/demo.yaml --replicas 4
  tfde train --help
"""


def build_parser():
  """The `tfde` argument parser (standard library only)."""
  formatter = argparse.RawDescriptionHelpFormatter
  parser = argparse.ArgumentParser(
      prog="tfde", formatter_class=formatter, epilog=MAIN_EXAMPLES,
      description="tfde: TensorFlow Distributed Embeddings (sharded embedding "
      "tables on stock TensorFlow).")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  train = sub.add_parser(
      "train", formatter_class=formatter, epilog=TRAIN_EXAMPLES,
      help="train a DLRM-style ranking model from a YAML config and write a report",
      description="Train a DLRM-style ranking model from a YAML config on N "
      "replicas, evaluate it, and write a report (metrics.json, summary.md, "
      "plots, TensorBoard logs, a checkpoint).")
  _add_job_arguments(train, "train", "report")
  train.add_argument("--projector", metavar="TABLE", action="append", default=[],
                     help="also write TABLE's rows for TensorBoard's embedding "
                     "projector (repeatable)")
  train.add_argument("--delta-every", metavar="N", type=int, default=0,
                     help="every N steps write a delta checkpoint (report_dir/"
                     "delta_checkpoints) and a delta serving export (report_dir/"
                     "serving); the report lists their sizes")
  train.add_argument("--plan", metavar="PLAN_JSON",
                     help="lay the tables out as this `tfde plan` plan.json says "
                     "(made for the job's tables and replica count)")

  inspect = sub.add_parser(
      "inspect", formatter_class=formatter, epilog=INSPECT_EXAMPLES,
      help="show what a checkpoint or SavedModel holds, table by table",
      description="Show, per embedding table of a checkpoint (written with "
      "any replica count) or SavedModel: its config, rows (live rows of a "
      "dynamic table), bytes of rows and optimizer slots, optimizer and step, "
      "and the distribution of its rows' norms. No strategy is needed.")
  inspect.add_argument("path", metavar="CHECKPOINT_OR_SAVEDMODEL",
                       help="a checkpoint prefix or folder, or a SavedModel folder")
  inspect.add_argument("--hot", type=int, default=0, metavar="K",
                       help="also list the K most frequent ids (tables that keep counts)")
  inspect.add_argument("--plot", metavar="DIR",
                       help="write row-norm and id-frequency plots (PNG) to DIR")
  _add_verbose(inspect)

  plan = sub.add_parser(
      "plan", formatter_class=formatter, epilog=PLAN_EXAMPLES,
      help="plan the sharding of a config's tables (tfde.planner)",
      description="Plan the sharding of a job config's tables on a batch of "
      "its data (tfde.planner): per table its kind, owners and bytes, per "
      "replica the totals; writes plan.txt, plan.json and plan.png.")
  _add_job_arguments(plan, "plan", "plan")
  plan.add_argument("--replicas", type=int, metavar="N",
                    help="replicas to plan for (default: the config's)")
  plan.add_argument("--memory-per-replica", metavar="BYTES",
                    help="bytes for rows and optimizer slots per replica, "
                    "e.g. 64MiB (default: unlimited)")
  return parser


def _add_job_arguments(parser, verb, written):
  """What `train` and `plan` both take: the job's config, its data, where
  the `written` goes, and --verbose."""
  parser.add_argument("--config", required=True, metavar="YAML",
                      help="the job config (see configs/demo.yaml)")
  parser.add_argument("--data", metavar="RATINGS_CSV",
                      help=f"{verb} on a MovieLens ratings.csv instead of generated data")
  parser.add_argument("--report-dir", metavar="DIR",
                      help=f"where to write the {written} (default: the config's report_dir)")
  _add_verbose(parser)


def _add_verbose(parser):
  parser.add_argument("--verbose", action="store_true",
                      help="show TensorFlow's start-up and runtime log lines")


@contextlib.contextmanager
def _stderr_silenced():
  """File descriptor 2 to /dev/null for the duration: the C++ log lines
  TensorFlow prints while it loads (oneDNN, cpu_feature_guard) come from
  absl before its logging is initialised, which ignores
  TF_CPP_MIN_LOG_LEVEL; only the descriptor catches them."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def load_tensorflow(verbose):
  """Imports TensorFlow and tfde, silencing their start-up log lines and
  later C++ and Python logs below errors unless `verbose`."""
  if verbose:
    _load_library()
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  with _stderr_silenced():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    _load_library()
  tf.get_logger().setLevel("ERROR")
  try:
    from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
    absl_logging.set_verbosity(absl_logging.ERROR)
  except ImportError:
    pass


def _load_library():
  """TensorFlow (checked), the op library and Keras: their start-up log
  lines come now, where `load_tensorflow` can silence them."""
  import tfde  # pylint: disable=g-import-not-at-top
  for name in ("ops", "layers"):
    getattr(tfde, name)


def main(argv=None):
  """Runs the `tfde` command with `argv` (default: sys.argv[1:]); returns
  its exit code."""
  args = build_parser().parse_args(argv)
  if args.command in ("train", "plan"):
    # The job's config, files and options, before TensorFlow: a typo is
    # answered at once, not after it has loaded.
    from tfde.app import job_checks  # pylint: disable=g-import-not-at-top
    try:
      checked = job_checks.checked_job(args)
    except job_checks.ConfigError as e:
      print(f"tfde: error: {e}", file=sys.stderr)
      return 2
    load_tensorflow(args.verbose)
    from tfde.app import cli  # pylint: disable=g-import-not-at-top
    if args.command == "train":
      return cli.train_command(args, checked)
    return cli.plan_command_main(args, checked)
  load_tensorflow(args.verbose)
  from tfde.app import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
  return inspect_lib.inspect_command(args)


if __name__ == "__main__":
  sys.exit(main())
