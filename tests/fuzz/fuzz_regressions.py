"""Fuzz findings kept as regression cases.

`make fuzz` draws a fresh seed each run and prints it; a finding is
reproduced with `python -m tests.fuzz.fuzz_cases --seed S --cases N`. Once it
is fixed, its (seed, case index) goes here with the op and mutation the
case was, and tests/fuzz/test_fuzz_regressions.py runs every entry on both
backends in `make test`, so the defect cannot come back unseen.

The op and mutation pin what the entry means: a case is a function of
(seed, index) through the schedule of tests/fuzz/fuzz_runner.py, so adding a
mutation or an op can move it; the test then says so and the entry is
re-pinned (find the new index of that op and mutation under the seed).
"""

import collections

Regression = collections.namedtuple("Regression", "seed index op mutation found")

REGRESSIONS = [
    Regression(0, 263, "dynamic_store.lookup", "counts_count",
               "counts of shape [n, 1] were accepted by a dynamic lookup"),
    Regression(0, 371, "dynamic_store.import_", "pending_ids_repeated",
               "an import with repeated pending ids was accepted"),
    Regression(0, 13, "dynamic_store.import_", "pending_id_has_row",
               "an import with an id both a row and pending was accepted"),
]
