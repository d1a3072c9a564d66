"""`python -m tfde.app ...`: the `tfde` command."""

import sys

from tfde.app import command

if __name__ == "__main__":
  sys.exit(command.main())
