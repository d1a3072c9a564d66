"""The `tfde` command's front (tfde.app.command): help without TensorFlow, quick;
one line on stderr for a config error, found before TensorFlow loads; TensorFlow's start-up lines only
with --verbose; each subcommand's help has a description and an example."""

import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _commands():
  """Every subcommand the parser has (so a new one is checked too)."""
  import argparse  # pylint: disable=g-import-not-at-top

  from tfde.app import command  # pylint: disable=g-import-not-at-top
  action = next(a for a in command.build_parser()._actions  # pylint: disable=protected-access
                if isinstance(a, argparse._SubParsersAction))  # pylint: disable=protected-access
  return sorted(action.choices)


def _python(code, timeout=120):
  """`python -c code` with this checkout on the path."""
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO, timeout=timeout)


def _run(args, env=None, timeout=120):
  env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)   # as a user's shell has it
  return subprocess.run([sys.executable, "-m", "tfde.app"] + args, capture_output=True,
                        text=True, env=env, cwd=REPO, timeout=timeout)


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["inspect", "--help"]])
def test_help_is_quick_and_imports_no_tensorflow(args):
  # -X importtime lists every module imported, on stderr.
  env = dict(os.environ, PYTHONPATH=REPO)
  start = time.perf_counter()
  result = subprocess.run([sys.executable, "-X", "importtime", "-m", "tfde.app"] + args,
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
  elapsed = time.perf_counter() - start
  assert result.returncode == 0, result.stderr[-2000:]
  imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
  # tfde's facade is lazy: the command imports it and none of its submodules
  # but the command's own and the version check's.
  assert not {"tensorflow", "keras", "numpy"} & imported
  assert {m for m in imported if m.startswith("tfde.")} <= {
      "tfde.app", "tfde.app.command", "tfde.app.__main__", "tfde.tf_version"}
  assert elapsed < 1.0, elapsed
  assert "usage: tfde" in result.stdout


def test_every_subcommand_has_a_description_and_an_example():
  top = _run(["--help"]).stdout
  commands = _commands()
  assert {"train", "inspect"} <= set(commands)
  for command in commands:
    line = next(l for l in top.splitlines() if l.strip().startswith(command + " "))
    assert len(line.split(None, 1)[1]) > 20, line   # its one-line description
    assert f"tfde {command} " in top.split("examples:")[1]
    text = _run([command, "--help"]).stdout
    assert "examples:" in text and f"\n  tfde {command} " in text, text


def test_a_config_error_is_the_only_stderr_line(tmp_path):
  config = tmp_path / "bad.yaml"
  config.write_text("name: x\nmodel:\n  bottom_mlp: 8\ndata:\n  sparse_features:\n"
                    "    - {name: a, vocabulary_size: 10}\n")
  result = _run(["train", "--config", str(config)])
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
      f"tfde: error: {config}: model.bottom_mlp: must be a list of positive ints, got 8"]
  assert result.stdout == ""


def test_a_bad_job_is_refused_before_tensorflow_loads(tmp_path):
  """A config's syntax or values, a missing data file, a bad option: each
  answered without TensorFlow (its loading took about 7 s here)."""
  syntax = tmp_path / "syntax.yaml"
  syntax.write_text("name: x\nseed: [1\nreplicas: 2\n")
  value = tmp_path / "value.yaml"
  value.write_text("name: x\nmodel:\n  bottom_mlp: 8\ndata:\n  sparse_features:\n"
                   "    - {name: a, vocabulary_size: 10}\n")
  for args, words in ((["train", "--config", str(syntax)], "YAML syntax error"),
                      (["train", "--config", str(value)], "model.bottom_mlp: must be"),
                      (["train", "--config", "configs/demo.yaml", "--data",
                        str(tmp_path / "no.csv")], "--data: cannot read"),
                      (["plan", "--config", "configs/demo.yaml", "--replicas", "0"],
                       "--replicas: must be >= 1")):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "tfde.app"] + args,
                            capture_output=True, text=True, cwd=REPO, timeout=60,
                            env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 2, (args, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    assert "tfde.config" in imported and not {"tensorflow", "keras"} & imported, args
    errors = [line for line in lines if not line.startswith("import time:")]
    assert len(errors) == 1 and errors[0].startswith("tfde: error: ") and words in errors[0], \
        (args, errors)


def test_verbose_shows_tensorflow_start_up_lines(tmp_path):
  # An error found once TensorFlow has loaded (a config's is found before).
  missing = str(tmp_path / "missing")
  quiet = _run(["inspect", missing])
  loud = _run(["inspect", missing, "--verbose"])
  assert quiet.returncode == loud.returncode == 2
  assert len(quiet.stderr.splitlines()) == 1
  # TensorFlow's own lines (oneDNN, cpu_feature_guard, absl) come back.
  assert len(loud.stderr.splitlines()) > 1
  assert loud.stderr.splitlines()[-1] == quiet.stderr.splitlines()[0]


def test_an_unknown_command_is_an_argument_error():
  result = _run(["trian"])
  assert result.returncode == 2
  assert "invalid choice: 'trian'" in result.stderr


def test_import_tfde_loads_no_tensorflow_until_a_submodule_is_used():
  code = ("import sys, tfde\n"
          "assert 'tensorflow' not in sys.modules, 'import tfde loaded TensorFlow'\n"
          "assert {'TableConfig', 'lookup', 'layers'} <= set(dir(tfde))\n"
          "tfde.TableConfig\n"
          "assert 'tfde.config' in sys.modules\n"
          "assert 'tensorflow' not in sys.modules, 'a config is data'\n"
          "tfde.lookup\n"
          "assert 'tensorflow' in sys.modules\n")
  result = _python(code)
  assert result.returncode == 0, result.stderr[-2000:]


def test_the_old_module_warns_and_forwards():
  code = ("import warnings\n"
          "with warnings.catch_warnings(record=True) as caught:\n"
          "  warnings.simplefilter('always')\n"
          "  import tfde_cli\n"
          "from tfde.app import command\n"
          "assert tfde_cli.main is command.main\n"
          "assert [w.category for w in caught] == [DeprecationWarning], caught\n")
  result = _python(code)
  assert result.returncode == 0, result.stderr[-2000:]
  old = subprocess.run([sys.executable, "-m", "tfde_cli", "--help"], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO, timeout=60)
  assert old.returncode == 0 and "usage: tfde" in old.stdout, old.stderr[-2000:]
