"""Runs the parts of `make test` and prints each one's time.

  python3 tools/timed.py "environments=make envs" --then \\
      "main suite=make test-main" --then "docs=make docs" "lane tf215=make test-tf215"

Stages (separated by `--then`) run one after another. The parts of a stage
run side by side, as many at once as this process may use cores (a lane
is one pytest process, about half of a 2-core host; the main suite, with
a worker per core, is a stage of its own); a part that runs beside others
writes to a log of its own, printed whole when it ends, so that outputs do
not mix. A part alone in its stage writes straight through (the main
suite's progress). Every part runs even when an earlier one failed (so
that one run shows all that fails); the exit status is the first
failure's, in the order given (a part ended by a signal: FAILED (-N)).

Interrupted (Ctrl-C, SIGTERM), it stops every running part's process
group (SIGTERM, then SIGKILL after 10 s), prints what each had written and
the times so far, and exits 128 + the signal's number.

The main suite's share of the budget (docs/testing.md) is 15 minutes on a
2-core host; past it a warning is printed, not a failure, since hosts of
this kind differ up to 3x in speed.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MAIN_SUITE = "main suite"
MAIN_SUITE_BUDGET_S = 15 * 60
STAGE_SEPARATOR = "--then"
STOP_GRACE_S = 10


class Interrupted(Exception):
  """A signal asked the run to stop."""

  def __init__(self, signum):
    super().__init__(signum)
    self.signum = signum


def _clock(seconds):
  minutes, seconds = divmod(int(round(seconds)), 60)
  return f"{minutes}:{seconds:02d}"


def usable_cores():
  """The cores this process may run on (its affinity, not the host's
  count: a CI job pinned to one core runs one part at a time)."""
  if hasattr(os, "process_cpu_count"):
    return os.process_cpu_count() or 1
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0)) or 1
  return os.cpu_count() or 1


def parse(argv):
  """[[(name, command), ...] per stage] of `argv`."""
  stages = [[]]
  for arg in argv:
    if arg == STAGE_SEPARATOR:
      stages.append([])
      continue
    name, sep, command = arg.partition("=")
    if not sep or not name or not command:
      raise SystemExit(f"timed.py: expected NAME=COMMAND or {STAGE_SEPARATOR}, got {arg!r}")
    stages[-1].append((name, command))
  if any(not stage for stage in stages):
    raise SystemExit(f"timed.py: a stage without parts (a leading, trailing or doubled "
                     f"{STAGE_SEPARATOR})")
  return stages


class _Part:
  """One running part: its own process group (so that stopping it stops
  everything it started), its output to a log when it runs beside others."""

  def __init__(self, name, command, beside):
    self.name = name
    self.log = tempfile.TemporaryFile() if beside else None   # bytes, whatever they are
    self.start = time.monotonic()
    self.process = subprocess.Popen(
        command, shell=True, start_new_session=True,
        stdin=subprocess.DEVNULL if beside else None,
        stdout=self.log, stderr=subprocess.STDOUT if beside else None)

  def stop(self):
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
      try:
        os.killpg(self.process.pid, sig)
      except ProcessLookupError:
        return
      try:
        self.process.wait(wait_s)
        return
      except subprocess.TimeoutExpired:
        continue

  def finish(self, note=""):
    """(name, seconds, exit status); prints the log, if any."""
    seconds = time.monotonic() - self.start
    code = self.process.returncode
    if self.log is not None:
      print(f"\n==> {self.name}: ended{note} in {_clock(seconds)} ({code}); its output:",
            flush=True)
      self.log.seek(0)
      shutil.copyfileobj(self.log, sys.stdout.buffer)
      sys.stdout.buffer.flush()
      self.log.close()
    return self.name, seconds, code


def _run_stage(stage, slots, results):
  """Runs `stage`'s parts, at most `slots` at once (alone, straight
  through, when one part or one slot); appends (name, seconds, code) of
  each to `results` in the order given."""
  beside = len(stage) > 1 and slots > 1
  pending = list(enumerate(stage))
  running = {}   # index: _Part
  done = {}
  try:
    while pending or running:
      while pending and len(running) < (slots if beside else 1):
        index, (name, command) = pending.pop(0)
        note = " (beside others; its output when it ends)" if beside else ""
        print(f"\n==> {name}{note}: {command}", flush=True)
        running[index] = _Part(name, command, beside)
      time.sleep(0.2)
      for index in [i for i, p in running.items() if p.process.poll() is not None]:
        done[index] = running.pop(index).finish()
  except Interrupted:
    for index, part in running.items():
      part.stop()
      done[index] = part.finish(note=", stopped,")
    raise
  finally:
    results.extend(done[i] for i in sorted(done))


def _report(stage_times, results):
  rows = [(name, seconds, "ok" if code == 0 else f"FAILED ({code})")
          for name, seconds, code in results]
  rows += [(f"{parts} parts side by side", seconds, "")
           for parts, seconds in stage_times if parts > 1]
  rows.append(("total", sum(s for _, s in stage_times), ""))
  width = max(22, *(len(name) for name, _, _ in rows))
  print("\nmake test, each part's time:")
  for name, seconds, status in rows:
    print(f"  {name:<{width}} {_clock(seconds):>7}  {status}".rstrip())
  for name, seconds, _ in results:
    if name == MAIN_SUITE and seconds > MAIN_SUITE_BUDGET_S:
      print(f"WARNING: the main suite took {_clock(seconds)}, over its budget of "
            f"{_clock(MAIN_SUITE_BUDGET_S)} (docs/testing.md)")


def main(argv, slots=None):
  stages = parse(argv)
  slots = slots or usable_cores()
  results, stage_times = [], []

  def interrupt(signum, frame):
    del frame
    raise Interrupted(signum)

  previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    for stage in stages:
      t0 = time.monotonic()
      try:
        _run_stage(stage, slots, results)
      finally:
        stage_times.append((len(stage), time.monotonic() - t0))
  except Interrupted as stop:
    _report(stage_times, results)
    print(f"stopped by signal {stop.signum}, before the end", flush=True)
    return 128 + stop.signum
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  _report(stage_times, results)
  failed = [code for _, _, code in results if code]
  return failed[0] if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
