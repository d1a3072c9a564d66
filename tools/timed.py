"""Runs the parts of `make test` and prints each one's time.

  python3 tools/timed.py "environments=make envs" --then \\
      "main suite=make test-main" --then "docs=make docs" "lane tf215=make test-tf215"

Stages (separated by `--then`) run one after another. The parts of a stage
run side by side, as many at once as the host has cores (a lane is one
pytest process, about half of a 2-core host; the main suite, with a worker
per core, is a stage of its own); a part that runs beside others writes to
a log of its own, printed whole when it ends, so that outputs do not mix.
A part alone in its stage writes straight through (the main suite's
progress). Every part runs even when an earlier one failed (so that one
run shows all that fails); the exit status is the first failure's, in the
order given.

The main suite's share of the budget (docs/testing.md) is 15 minutes on a
2-core host; past it a warning is printed, not a failure, since hosts of
this kind differ up to 3x in speed.
"""

import os
import subprocess
import sys
import tempfile
import time

MAIN_SUITE = "main suite"
MAIN_SUITE_BUDGET_S = 15 * 60
STAGE_SEPARATOR = "--then"


def _clock(seconds):
  minutes, seconds = divmod(int(round(seconds)), 60)
  return f"{minutes}:{seconds:02d}"


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


def _run_alone(name, command):
  print(f"\n==> {name}: {command}", flush=True)
  t0 = time.time()
  code = subprocess.run(command, shell=True).returncode
  return name, time.time() - t0, code


def _run_beside(parts, slots):
  """Runs `parts` at most `slots` at once; (name, seconds, code) of each,
  in the order given."""
  pending = list(enumerate(parts))
  running = {}   # index: (process, log, start)
  results = {}
  while pending or running:
    while pending and len(running) < slots:
      index, (name, command) = pending.pop(0)
      print(f"\n==> {name} (beside others; its output when it ends): {command}", flush=True)
      log = tempfile.TemporaryFile(mode="w+")
      process = subprocess.Popen(command, shell=True, stdout=log, stderr=subprocess.STDOUT)
      running[index] = (process, log, time.time())
    time.sleep(0.2)
    for index in [i for i, (p, _, _) in running.items() if p.poll() is not None]:
      process, log, start = running.pop(index)
      name = parts[index][0]
      seconds = time.time() - start
      log.seek(0)
      print(f"\n==> {name}: ended in {_clock(seconds)} ({process.returncode}); its output:",
            flush=True)
      sys.stdout.write(log.read())
      sys.stdout.flush()
      log.close()
      results[index] = (name, seconds, process.returncode)
  return [results[i] for i in range(len(parts))]


def main(argv, slots=None):
  stages = parse(argv)
  slots = slots or os.cpu_count() or 1
  results = []
  started = time.time()
  for stage in stages:
    if len(stage) == 1 or slots == 1:
      results.extend(_run_alone(name, command) for name, command in stage)
    else:
      results.extend(_run_beside(stage, slots))
  total = time.time() - started
  print("\nmake test, each part's time (parts of one stage ran side by side):")
  for name, seconds, code in results:
    print(f"  {name:<22} {_clock(seconds):>7}  {'ok' if code == 0 else f'FAILED ({code})'}")
  print(f"  {'total':<22} {_clock(total):>7}")
  for name, seconds, _ in results:
    if name == MAIN_SUITE and seconds > MAIN_SUITE_BUDGET_S:
      print(f"WARNING: the main suite took {_clock(seconds)}, over its budget of "
            f"{_clock(MAIN_SUITE_BUDGET_S)} (docs/testing.md)")
  failed = [code for _, _, code in results if code]
  return failed[0] if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
