"""The `tfde` command's front (tfde_cli): help without TensorFlow, quick;
one line on stderr for a config error; TensorFlow's start-up lines only
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

  import tfde_cli  # pylint: disable=g-import-not-at-top
  action = next(a for a in tfde_cli.build_parser()._actions  # pylint: disable=protected-access
                if isinstance(a, argparse._SubParsersAction))  # pylint: disable=protected-access
  return sorted(action.choices)


def _run(args, env=None, timeout=120):
  env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)   # as a user's shell has it
  return subprocess.run([sys.executable, "-m", "tfde_cli"] + args, capture_output=True,
                        text=True, env=env, cwd=REPO, timeout=timeout)


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["inspect", "--help"]])
def test_help_is_quick_and_imports_no_tensorflow(args):
  # -X importtime lists every module imported, on stderr.
  env = dict(os.environ, PYTHONPATH=REPO)
  start = time.perf_counter()
  result = subprocess.run([sys.executable, "-X", "importtime", "-m", "tfde_cli"] + args,
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
  elapsed = time.perf_counter() - start
  assert result.returncode == 0, result.stderr[-2000:]
  imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
  assert not {"tensorflow", "tfde", "keras", "numpy"} & imported
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


def test_verbose_shows_tensorflow_start_up_lines(tmp_path):
  config = tmp_path / "bad.yaml"
  config.write_text("name: x\nreplicas: 0\n")
  quiet = _run(["train", "--config", str(config)])
  loud = _run(["train", "--config", str(config), "--verbose"])
  assert quiet.returncode == loud.returncode == 2
  assert len(quiet.stderr.splitlines()) == 1
  # TensorFlow's own lines (oneDNN, cpu_feature_guard, absl) come back.
  assert len(loud.stderr.splitlines()) > 1
  assert loud.stderr.splitlines()[-1] == quiet.stderr.splitlines()[0]


def test_an_unknown_command_is_an_argument_error():
  result = _run(["trian"])
  assert result.returncode == 2
  assert "invalid choice: 'trian'" in result.stderr
