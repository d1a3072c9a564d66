"""`tfde train` ends in one line on stderr, not a traceback, for a job this
machine cannot hold (absurd vocabulary_size or train_samples), a --plan
that is not a plan, and a disk that fills up mid-run."""

import errno
import json
import os
import subprocess
import sys
import uuid

import pytest
import yaml

from tfde.app import cli
from tfde.app import command
from tfde.app import limits
from tfde.app import plan_command
from tfde.app.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = {
    "name": "tiny", "seed": 1, "replicas": 1,
    "data": {"kind": "synthetic", "train_samples": 2000, "eval_samples": 1000,
             "dense_features": 2, "sparse_features": [
                 {"name": "a", "vocabulary_size": 20000, "hotness": 1},
                 {"name": "c", "vocabulary_size": 30, "hotness": 2}]},
    "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8]},
    "training": {"batch_size": 256, "epochs": 1},
}


def _config(tmp_path, **data):
  config = dict(TINY, data=dict(TINY["data"], **data))
  path = tmp_path / "job.yaml"
  path.write_text(yaml.safe_dump(config))
  return str(path)


def _train(argv, capsys):
  args = command.build_parser().parse_args(["train"] + argv)
  rc = cli.train_command(args)
  return rc, capsys.readouterr().err


@pytest.mark.parametrize("data,key,what", [
    ({"sparse_features": [{"name": "a", "vocabulary_size": 10**13},
                          {"name": "c", "vocabulary_size": 30}]},
     r"data\.sparse_features\[0\]\.vocabulary_size", "the tables' rows alone"),
    ({"train_samples": 10**10}, r"data\.train_samples", "the generated samples alone")])
def test_a_job_larger_than_memory_is_one_line(tmp_path, capsys, data, key, what):
  import re  # pylint: disable=g-import-not-at-top
  config = _config(tmp_path, **data)
  rc, err = _train(["--config", config, "--report-dir", str(tmp_path / "r")], capsys)
  assert rc == 2, err
  assert len(err.strip().splitlines()) == 1, err
  assert re.match(rf"tfde: error: {re.escape(config)}: {key}: too large for this "
                  rf"machine: {what}", err), err
  assert not (tmp_path / "r" / "metrics.json").exists()


def test_the_memory_rule_by_numbers():
  """Rows alone: vocabulary x dim x 4 bytes; samples: 8 an id, 4 a float."""
  from tfde.app.config import JobConfig  # pylint: disable=g-import-not-at-top
  config = JobConfig.from_config(TINY)
  rows = (20000 + 30) * 8 * 4
  samples = 3000 * ((1 + 2) * 8 + (2 + 1) * 4)
  limits.check_fits_memory(config, memory=max(rows, samples))
  with pytest.raises(ConfigError, match="vocabulary_size"):
    limits.check_fits_memory(config, memory=rows - 1)
  narrow = JobConfig.from_config(dict(TINY, data=dict(TINY["data"], sparse_features=[
      {"name": "a", "vocabulary_size": 20, "hotness": 1},
      {"name": "c", "vocabulary_size": 30, "hotness": 2}])))
  limits.check_fits_memory(narrow, memory=samples)
  with pytest.raises(ConfigError, match="train_samples"):
    limits.check_fits_memory(narrow, memory=samples - 1)


def test_a_plan_whose_tables_is_a_list_is_one_line(tmp_path):
  path = tmp_path / "plan.json"
  path.write_text(json.dumps({"num_replicas": 1, "tables": [
      {"kind": "replicated", "owners": [0]}]}))
  with pytest.raises(ConfigError, match=r"^--plan: .*is not a tfde plan.*tables must "
                     r"be a mapping of table name -> layout, got a list"):
    plan_command.load_plan(str(path), 1, ["a", "c"])


@pytest.mark.parametrize("text", ["inf", "nan", "-inf"])
def test_a_memory_budget_of_inf_or_nan_is_refused(text):
  with pytest.raises(ValueError, match="not a size in bytes"):
    plan_command.parse_bytes(text)


@pytest.mark.parametrize("error,where", [
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/r/metrics.json"), "/r/metrics.json"),
    (RuntimeError("{{function_node __wrapped__SaveV2}} /r/ckpt-7_temp/part-0.data"
                  ".tempstate123; No space left on device [Op:SaveV2]"),
     "/r/ckpt-7_temp/part-0.data")])
def test_a_full_disk_mid_run_is_one_line_naming_the_path(tmp_path, capsys, monkeypatch,
                                                         error, where):
  def full(*args, **kwargs):
    raise error
  monkeypatch.setattr(cli, "run_job", full)
  rc, err = _train(["--config", _config(tmp_path), "--report-dir", str(tmp_path / "r")],
                   capsys)
  assert rc == 1
  assert err == f"tfde: error: disk full while writing {where}: No space left on device\n"


def test_other_errors_still_raise(tmp_path, capsys, monkeypatch):
  """Only a full disk becomes one line; a defect keeps its traceback."""
  def broken(*args, **kwargs):
    raise RuntimeError("a defect")
  monkeypatch.setattr(cli, "run_job", broken)
  with pytest.raises(RuntimeError, match="a defect"):
    _train(["--config", _config(tmp_path), "--report-dir", str(tmp_path / "r")], capsys)


def test_a_real_disk_filling_up_mid_run(tmp_path):
  """A 256 KiB tmpfs: the folder check passes, the checkpoint fills it."""
  mount = f"/tmp/tfde-full-{uuid.uuid4().hex[:8]}"
  os.makedirs(mount)
  try:
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount],
                          capture_output=True, check=False)
  except OSError:
    made = None
  if made is None or made.returncode != 0:
    os.rmdir(mount)
    pytest.skip("cannot mount a small tmpfs here (needs root)")
  try:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    result = subprocess.run(
        [sys.executable, "-m", "tfde.app.cli", "train", "--config", _config(tmp_path),
         "--report-dir", os.path.join(mount, "r")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
  finally:
    subprocess.run(["umount", mount], check=False)
    os.rmdir(mount)
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"tfde: error: disk full while writing {mount}/r/"), last
  assert last.endswith(": No space left on device"), last
