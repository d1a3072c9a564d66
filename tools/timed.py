"""Runs the parts of `make test` one after another and prints each one's time.

  python3 tools/timed.py "environments=make envs" "main suite=make test-main" ...

Every part runs even when an earlier one failed (so that one run shows all
that fails); the exit status is the first failure's. The main suite's
share of the budget (docs/testing.md) is 15 minutes on a 2-core host; past
it a warning is printed, not a failure, since hosts of this kind differ up
to 3x in speed.
"""

import subprocess
import sys
import time

MAIN_SUITE = "main suite"
MAIN_SUITE_BUDGET_S = 15 * 60


def _clock(seconds):
  minutes, seconds = divmod(int(round(seconds)), 60)
  return f"{minutes}:{seconds:02d}"


def main(argv):
  parts = []
  for arg in argv:
    name, sep, command = arg.partition("=")
    if not sep or not name or not command:
      raise SystemExit(f"timed.py: expected NAME=COMMAND, got {arg!r}")
    parts.append((name, command))
  results = []
  started = time.time()
  for name, command in parts:
    print(f"\n==> {name}: {command}", flush=True)
    t0 = time.time()
    code = subprocess.run(command, shell=True).returncode
    results.append((name, time.time() - t0, code))
  total = time.time() - started
  print("\nmake test, each part's time:")
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
