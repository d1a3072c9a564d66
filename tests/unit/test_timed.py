"""tools/timed.py, which runs and times `make test`'s parts: stages in
order, the parts of one stage side by side, every part run whatever fails,
the first failure's status."""

import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import timed  # noqa: E402  pylint: disable=g-import-not-at-top


def _spans(folder, names):
  """{name: (start, end)} written by the parts' commands."""
  spans = {}
  for name in names:
    start, end = open(os.path.join(folder, name)).read().split()
    spans[name] = (float(start), float(end))
  return spans


def _part(folder, name, seconds, code=0):
  stamp = "python3 -c 'import time; print(time.time())'"
  return (f"{name}=echo {name} says hi; s=$({stamp}); sleep {seconds}; "
          f"echo $s $({stamp}) > {folder}/{name}; exit {code}")


def test_stages_run_in_order_and_a_stages_parts_side_by_side(tmp_path, capsys):
  argv = [_part(tmp_path, "first", 0.1), "--then",
          _part(tmp_path, "a", 1.0), _part(tmp_path, "b", 1.0, code=3), _part(tmp_path, "c", 0.1),
          "--then", _part(tmp_path, "last", 0.1, code=5)]
  assert timed.main(argv, slots=2) == 3        # the first failure, in the order given
  spans = _spans(tmp_path, ["first", "a", "b", "c", "last"])
  assert spans["first"][1] <= min(spans[n][0] for n in "abc")
  assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1]   # a and b overlap
  assert spans["c"][0] >= min(spans["a"][1], spans["b"][1])                # two at once at most
  assert max(spans[n][1] for n in "abc") <= spans["last"][0]
  out = capsys.readouterr().out
  # A part beside others prints its output whole, after its command ran.
  assert out.index("==> b: ended in") < out.index("\nb says hi\n")
  table = out[out.index("each part's time"):]
  for name, status in [("first", "ok"), ("a", "ok"), ("b", "FAILED (3)"), ("c", "ok"),
                       ("last", "FAILED (5)"), ("total", "")]:
    assert any(line.split()[0] == name and line.endswith(status)
               for line in table.splitlines()[1:]), (name, table)
  assert "  3 parts side by side " in table, table   # a, b and c's stage


def test_the_main_suite_past_its_budget_warns_without_failing(monkeypatch, capsys):
  monkeypatch.setattr(timed, "MAIN_SUITE_BUDGET_S", 0)
  assert timed.main(["main suite=sleep 1"]) == 0
  assert "WARNING: the main suite took 0:01, over its budget of 0:00" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["no-equals"], ["--then", "a=true"], ["a=true", "--then"],
                                  ["a=true", "--then", "--then", "b=true"], ["=true"]])
def test_a_malformed_command_line_is_refused(argv):
  with pytest.raises(SystemExit, match="timed.py"):
    timed.parse(argv)


def test_one_slot_runs_a_stages_parts_one_after_another(tmp_path):
  argv = [_part(tmp_path, "a", 0.5), _part(tmp_path, "b", 0.5)]
  assert timed.main(argv, slots=1) == 0
  spans = _spans(tmp_path, ["a", "b"])
  assert spans["a"][1] <= spans["b"][0]


def test_output_of_any_bytes_comes_through_whole(tmp_path, capsysbinary):
  """A part beside others may print bytes that are no UTF-8 (a test's
  binary data): its log is copied as bytes, and the other parts' too."""
  argv = ["a=printf 'caf\\351\\n'", "b=echo from b"]
  assert timed.main(argv, slots=2) == 0
  out = capsysbinary.readouterr().out
  assert b"caf\xe9\n" in out and b"from b" in out and b"total" in out


def test_a_terminated_run_stops_its_parts_and_says_what_they_wrote(tmp_path):
  """SIGTERM (or Ctrl-C) while two parts run side by side: both process
  groups stop (a grandchild too), their output so far and the table are
  printed, and the run exits 128 + 15."""
  pids = tmp_path / "pids"
  part = "{0}=echo {0} started; sleep 60 & echo $! >> " + str(pids) + "; wait"
  runner = subprocess.Popen(
      [sys.executable, timed.__file__, part.format("a"), part.format("b")],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 30
  while time.time() < deadline and (not pids.exists() or
                                    len(pids.read_text().split()) < 2):
    time.sleep(0.1)
  runner.send_signal(signal.SIGTERM)
  out = runner.communicate(timeout=60)[0].decode()
  assert runner.returncode == 128 + signal.SIGTERM, out
  assert "a started" in out and "b started" in out and "stopped by signal 15" in out, out
  assert "==> a: ended, stopped," in out, out
  for pid in pids.read_text().split():   # the parts' own children
    assert not _alive(int(pid)), pid


def _alive(pid):
  """Whether `pid` runs (a zombie, dead but not yet reaped by whichever
  process adopted it, does not)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rpartition(")")[2].split()[0] != "Z"
  except FileNotFoundError:
    return False
