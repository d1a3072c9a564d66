"""`make help` lists every target of the Makefile, each on one line."""

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _targets():
  """Every target make itself knows from the Makefile (its database, with
  the pattern rules expanded), but the special and the file targets."""
  database = subprocess.run(["make", "-pRrq", "-f", "Makefile", ":"], cwd=REPO,
                            capture_output=True, text=True).stdout
  phony = set()
  for line in database.splitlines():
    if line.startswith(".PHONY:"):
      phony.update(line.split(":", 1)[1].split())
  return phony


def test_every_target_has_one_line_in_make_help():
  targets = _targets()
  assert {"test", "demo", "help", "ops", "test-tf216", "test-unit"} <= targets
  listed = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
  names = set()
  for line in listed.splitlines():
    match = re.match(r"^  (\S+(?:, \S+)*)\s{2,}\S", line)
    assert match, f"not a target line: {line!r}"
    names.update(match.group(1).split(", "))
  missing = sorted(targets - names)
  assert not missing, f"targets without a line in `make help`: {missing}"
  unknown = sorted(names - targets)
  assert not unknown, f"`make help` lists targets the Makefile lacks: {unknown}"
