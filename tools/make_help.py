"""Prints `make help`: every target's `## NAME: what it does` line of the Makefile.

A line may name several targets (`## test-tf216, test-tf217: ...`).
tests/unit/test_make_help.py checks that every target is listed.
"""

import re
import sys

LINE = re.compile(r"^## ([\w.%-]+(?:, [\w.%-]+)*): (.+)$")


def entries(makefile):
  """(names, text) for each `## ` line, in the Makefile's order."""
  with open(makefile) as f:
    for line in f:
      match = LINE.match(line.rstrip("\n"))
      if match:
        yield match.group(1).split(", "), match.group(2)


def main(argv):
  makefile = argv[0] if argv else "Makefile"
  rows = [(", ".join(names), text) for names, text in entries(makefile)]
  width = max(len(names) for names, _ in rows)
  for names, text in rows:
    print(f"  {names:<{width}}  {text}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
