"""The `tfde train` config: one schema, checked before any work; every
error one line naming the file and the key (or the line and column of a
YAML error), exit code 2, no traceback.

Most cases call `cli.main` in this process (it returns before TensorFlow
runs anything); a few run the command as a user would, in a subprocess.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.unit.test_cli import SMALL
from tfde.app import cli
from tfde.app import config as config_lib
from tfde.app import data as data_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "configs", "demo.yaml")


def _small(**changes):
  config = json.loads(json.dumps(SMALL))
  for key, value in changes.items():
    *path, last = key.split(".")
    section = config
    for part in path:
      section = section[int(part)] if part.isdigit() else section[part]
    section[int(last) if isinstance(section, list) else last] = value
  return config


def _write(tmp_path, config, name="job.yaml"):
  path = tmp_path / name
  if isinstance(config, bytes):
    path.write_bytes(config)
  elif isinstance(config, str):
    path.write_text(config)
  else:
    path.write_text(yaml.safe_dump(config))
  return str(path)


def _main_fails(capsys, argv):
  """Runs `tfde train ARGV` in-process; it must exit 2 with one line."""
  assert cli.main(["train"] + argv) == 2
  captured = capsys.readouterr()
  assert "Traceback" not in captured.err and not captured.out
  lines = captured.err.splitlines()
  assert len(lines) == 1, captured.err
  assert lines[0].startswith("tfde: error: ")
  return lines[0][len("tfde: error: "):]


_DEMO_TEXT = open(DEMO).read()
_SEED_LINE = _DEMO_TEXT.splitlines().index("seed: 0") + 1

# (name, config (dict, YAML text or bytes), expected message after the file)
_BAD = [
    ("yaml_syntax", "name: x\ndata:\n  kind: [synthetic\nmodel: 3\n",
     r":4:6: YAML syntax error: while parsing a flow sequence \(from line 3, "
     r"column 9\): expected ',' or '\]', but got ':'"),
    ("yaml_indent", "name: x\n  data: 1\n",
     ":2:7: YAML syntax error: mapping values are not allowed here"),
    ("binary", bytes(range(256)),
     r": not a YAML text file \(byte 0x80 at offset 128 is not UTF-8\)"),
    ("nul_bytes", b"name: x\x00\n",
     r":1:8: not a YAML text file \(character #x0000 is not allowed\)"),
    ("duplicate_key", _DEMO_TEXT.replace("seed: 0", "seed: 0\nseed: 1"),
     rf":{_SEED_LINE + 1}:1: YAML error: duplicate key 'seed' \(first on line "
     rf"{_SEED_LINE}\)"),
    ("empty", "", ": the config is empty"),
    ("not_a_mapping", "- a\n- b\n", ": the config must be a mapping"),
    ("bottom_mlp_int", _small(**{"model.bottom_mlp": 8}),
     ": model.bottom_mlp: must be a list of positive ints, got 8"),
    ("combiner", _small(**{"model.combiner": "max"}),
     ": model.combiner: must be one of sum, mean, sqrtn, got 'max'"),
    ("table_optimizer", _small(**{"model.table_optimizer.kind": "rmsprop"}),
     ": model.table_optimizer.kind: must be one of adagrad, adam, ftrl, rowwise_adagrad, "
     "sgd, got 'rmsprop'"),
    ("dense_optimizer", _small(**{"model.dense_optimizer.kind": "ftrl"}),
     ": model.dense_optimizer.kind: must be one of adagrad, adam, sgd, got 'ftrl'"),
    ("seed_float", _small(seed=1.5),
     r": seed: must be an int in \[0, 2147483647\], got 1.5"),
    ("batch_over_data", _small(**{"training.batch_size": 8000,
                                  "data.train_samples": 30000,
                                  "data.eval_samples": 6000}),
     r": training.batch_size: must be at most data.train_samples \(30000\) and "
     r"data.eval_samples \(6000\), got 8000"),
    ("batch_under_replicas", _small(**{"training.batch_size": 1}),
     r": training.batch_size: must be at least replicas \(2\), got 1"),
    ("feature_named_dense", _small(**{"data.sparse_features.1.name": "dense"}),
     r": data.sparse_features\[1\].name: must be a name of letters, digits and "
     r"_ not starting with a digit, other than dense, got 'dense'"),
    ("feature_name_slash", _small(**{"data.sparse_features.1.name": "a/weights"}),
     r": data.sparse_features\[1\].name: must be a name of letters"),
    ("duplicate_features", _small(**{"data.sparse_features.2.name": "a"}),
     r": data.sparse_features\[2\].name: duplicate feature name 'a' \(also "
     r"sparse_features\[0\]\)"),
    ("learning_rate_inf",
     yaml.safe_dump(_small(**{"model.table_optimizer.learning_rate": 0.1}))
     .replace("learning_rate: 0.1", "learning_rate: .inf"),
     ": model.table_optimizer.learning_rate: must be a positive finite number, "
     "got inf"),
    ("learning_rate_nan",
     yaml.safe_dump(_small(**{"model.dense_optimizer.learning_rate": 0.003}))
     .replace("learning_rate: 0.003", "learning_rate: .nan"),
     ": model.dense_optimizer.learning_rate: must be a positive finite number, "
     "got nan"),
    ("learning_rate_zero", _small(**{"model.table_optimizer.learning_rate": 0}),
     ": model.table_optimizer.learning_rate: must be a positive finite number, got 0"),
    ("zipf_alpha", _small(**{"data.zipf_alpha": 1}),
     r": data.zipf_alpha: must be a finite number > 1, got 1"),
    ("unknown_key", _small(**{"model.embeding_dim": 8}),
     r": model.embeding_dim: unknown key; did you mean 'embedding_dim'\? known "
     r"keys: bottom_mlp, combiner, "),
    ("unknown_top_key", _small(replica=2),
     r": replica: unknown key; did you mean 'replicas'\?"),
    ("missing_key", {k: v for k, v in SMALL.items() if k != "data"},
     ": data: required key is missing"),
    ("section_not_mapping", _small(model=5), ": model: must be a mapping, got 5"),
    ("feature_not_mapping", _small(**{"data.sparse_features.1": "b"}),
     r": data.sparse_features\[1\]: must be a mapping, got 'b'"),
    ("vocabulary", _small(**{"data.sparse_features.1.vocabulary_size": -3}),
     r": data.sparse_features\[1\].vocabulary_size: must be a positive int, got -3"),
    ("bool_is_not_int", _small(replicas=True),
     ": replicas: must be a positive int, got True"),
    ("batch_zero", _small(**{"training.batch_size": 0}),
     ": training.batch_size: must be a positive int, got 0"),
    ("data_kind", _small(**{"data.kind": "csv"}),
     ": data.kind: must be one of synthetic, movielens, got 'csv'"),
    ("movielens_path", _small(**{"data.kind": "movielens"}),
     ": data.path: required when data.kind is movielens"),
    ("no_features", _small(**{"data.sparse_features": []}),
     ": data.sparse_features: must list at least one feature"),
    ("bottom_mlp_end", _small(**{"model.bottom_mlp": [16, 4]}),
     r": model.bottom_mlp: must end in embedding_dim \(8\) for the dot "
     r"interaction, got \[16, 4\]"),
    ("bottom_mlp_empty", _small(**{"model.bottom_mlp": []}),
     r": model.bottom_mlp: must not be empty when data.dense_features > 0"),
    ("python_tag", "name: !!python/object/apply:os.system [ls]\n",
     ":1:7: YAML error: could not determine a constructor"),
]


@pytest.mark.parametrize("name,config,message", _BAD, ids=[c[0] for c in _BAD])
def test_bad_config_is_one_line_naming_file_and_key(tmp_path, capsys, name,
                                                   config, message):
  del name
  path = _write(tmp_path, config)
  with pytest.raises(cli.ConfigError) as error:
    cli.load_config(path)
  assert "\n" not in str(error.value)
  assert re.match(re.escape(path) + message, str(error.value)), str(error.value)
  line = _main_fails(capsys, ["--config", path])
  assert line == str(error.value)


def test_unreadable_config_file(tmp_path, capsys):
  missing = str(tmp_path / "nope.yaml")
  assert _main_fails(capsys, ["--config", missing]) == (
      f"{missing}: cannot read the config: No such file or directory")
  assert _main_fails(capsys, ["--config", str(tmp_path)]) == (
      f"{tmp_path}: cannot read the config: Is a directory")


def test_report_dir_must_be_writable_before_training(tmp_path, capsys):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  config = _small(report_dir=str(blocker / "report"))
  path = _write(tmp_path, config)
  line = _main_fails(capsys, ["--config", path])
  assert line.startswith(f"{path}: report_dir: cannot write to "
                         f"'{blocker / 'report'}': "), line
  line = _main_fails(capsys, ["--config", path, "--report-dir", str(blocker)])
  assert line == f"--report-dir: '{blocker}' is a file, not a folder"


def test_data_file_must_exist_before_training(tmp_path, capsys):
  path = _write(tmp_path, _small(report_dir=str(tmp_path / "r")))
  missing = str(tmp_path / "ratings.csv")
  assert _main_fails(capsys, ["--config", path, "--data", missing]) == (
      f"--data: cannot read '{missing}': No such file or directory")
  path = _write(tmp_path, _small(report_dir=str(tmp_path / "r"),
                                 data={"kind": "movielens", "path": missing}))
  assert _main_fails(capsys, ["--config", path]) == (
      f"{path}: data.path: cannot read '{missing}': No such file or directory")


def test_bad_ratings_file_names_file_and_line(tmp_path):
  csv = tmp_path / "ratings.csv"
  csv.write_text("userId,movieId,rating,timestamp\n1,2,4.0,0\n1,x,3.0,0\n")
  with pytest.raises(data_lib.DataError, match=re.escape(
      f"{csv}:3: expected non-negative integer userId and movieId and a "
      "finite rating, got ['1', 'x', '3.0']")):
    data_lib.movielens(str(csv))
  csv.write_text("user,movie\n1,2\n")
  with pytest.raises(data_lib.DataError, match="missing columns"):
    data_lib.movielens(str(csv))
  csv.write_bytes(bytes(range(256)))
  with pytest.raises(data_lib.DataError, match="not a UTF-8 text"):
    data_lib.movielens(str(csv))


# ------------------------------------------------- as a user runs it


def _run(args, timeout=120):
  # TF_ENABLE_ONEDNN_OPTS=0 silences TensorFlow's import-time oneDNN notice
  # (printed to stderr by `import tfde`, whatever TF_CPP_MIN_LOG_LEVEL says).
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0",
             PYTHONPATH=REPO)
  return subprocess.run([sys.executable, "-m", "tfde.app.cli", "train"] + args,
                        capture_output=True, text=True, env=env, cwd=REPO,
                        timeout=timeout)


def _one_line(result):
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr
  return lines[0]


def test_cli_yaml_syntax_error(tmp_path):
  path = _write(tmp_path, "name: x\nseed: [1\nreplicas: 2\n")
  line = _one_line(_run(["--config", path]))
  assert re.match(f"tfde: error: {re.escape(path)}:3:9: YAML syntax error: ", line), line


def test_cli_bad_value_and_missing_data_file(tmp_path):
  path = _write(tmp_path, _small(**{"model.bottom_mlp": 8}))
  line = _one_line(_run(["--config", path]))
  assert line == (f"tfde: error: {path}: model.bottom_mlp: must be a list of "
                  "positive ints, got 8")
  path = _write(tmp_path, _small(report_dir=str(tmp_path / "r")))
  line = _one_line(_run(["--config", path, "--data", str(tmp_path / "no.csv")]))
  assert line == f"tfde: error: --data: cannot read '{tmp_path / 'no.csv'}': " \
                 "No such file or directory"


def test_cli_ratings_file_smaller_than_the_batch(tmp_path):
  """Only known once the file is read, still before any training."""
  csv = tmp_path / "ratings.csv"
  csv.write_text("userId,movieId,rating,timestamp\n" +
                 "".join(f"{u},{u % 7},3.0,0\n" for u in range(1000)))
  config = _small(report_dir=str(tmp_path / "r"), replicas=1)
  config["data"].update(train_samples=3000, eval_samples=600)
  path = _write(tmp_path, config)
  line = _one_line(_run(["--config", path, "--data", str(csv)]))
  assert line == (f"tfde: error: {path}: training.batch_size: must be at most the "
                  f"400 train and 600 eval samples of MovieLens ratings from {csv}, "
                  "got 512")


# -------------------------------------------------------------- schema


def _sections():
  return [config_lib.JobConfig, config_lib.DataConfig,
          config_lib.SparseFeatureConfig, config_lib.ModelConfig,
          config_lib.TableOptimizerConfig, config_lib.DenseOptimizerConfig,
          config_lib.TrainingConfig]


@pytest.mark.parametrize("cls", _sections(), ids=lambda c: c.__name__)
def test_every_field_has_a_spec_and_is_documented(cls):
  doc = cls.__doc__
  assert "Attributes:" in doc
  for f in dataclasses.fields(cls):
    assert isinstance(f.metadata.get("spec"), config_lib.Spec), f.name
    assert re.search(rf"^    {f.name}: \S", doc, re.M), f"{cls.__name__}.{f.name}"


def test_demo_config_is_valid_and_round_trips():
  config = cli.load_config(DEMO)
  assert config.replicas == 2 and len(config.data.sparse_features) == 8
  plain = config.get_config()
  assert cli.JobConfig.from_config(plain) == config
  assert cli.JobConfig.from_config(yaml.safe_load(yaml.safe_dump(plain))) == config
  with open(DEMO) as f:
    written = yaml.safe_load(f)
  assert plain["model"]["table_optimizer"] == written["model"]["table_optimizer"]


def test_sections_check_themselves_however_made():
  with pytest.raises(cli.ConfigError, match="^combiner: must be one of"):
    cli.ModelConfig(combiner="max")
  with pytest.raises(cli.ConfigError,
                     match=r"^table_optimizer.learning_rate: must be a positive"):
    cli.ModelConfig(table_optimizer={"kind": "adam", "learning_rate": -1})
  model = cli.ModelConfig(table_optimizer={"kind": "adam", "learning_rate": 1})
  assert model.table_optimizer == cli.TableOptimizerConfig("adam", 1.0)


def test_yaml_1_2_floats(tmp_path):
  text = yaml.safe_dump(_small(**{"model.table_optimizer.learning_rate": 0.1})
                        ).replace("learning_rate: 0.1", "learning_rate: 1e-2")
  config = cli.load_config(_write(tmp_path, text))
  assert config.model.table_optimizer.learning_rate == 0.01


def test_table_optimizer_kinds_are_the_library_s():
  import tfde  # pylint: disable=g-import-not-at-top
  for kind in config_lib.TABLE_OPTIMIZERS:
    assert tfde.optimizers.get(kind).kind == kind
