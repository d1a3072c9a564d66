"""The fuzz findings of tests/fuzz/fuzz_regressions.py, each case run again on
the kernels and the twins: each must still meet every property of
tests/fuzz/test_fuzz.py (no crash, the oracle's result or refusal, an allowed
error, no state changed on an error, both backends agreeing)."""

import os

import pytest

import tfde.ops
from tests.fuzz import fuzz_cases
from tests.fuzz import fuzz_regressions
from tests.fuzz import fuzz_runner


def _run_case(seed, index):
  """The records of case `index` under `seed`, both backends."""
  records = {}
  got, crashed, how = fuzz_runner._run_child(seed, 2 * index, 2 * index + 2, 120, None)
  for r in got:
    records[r["job"]] = r
  if crashed is not None:
    records[crashed] = fuzz_runner._crash_record(seed, crashed, how, True)
  return records


@pytest.mark.parametrize("entry", fuzz_regressions.REGRESSIONS,
                         ids=lambda e: f"seed{e.seed}-case{e.index}-{e.mutation}")
def test_fuzz_regression(entry):
  if not tfde.ops.kernels_available():
    if os.environ.get("TFDE_OPS") == tfde.ops.REFERENCE:
      pytest.skip("TFDE_OPS=reference: the fuzz compares the kernels with the twins")
    pytest.fail(f"tfde op library unavailable: {tfde.ops.native.load_error()}")
  case = fuzz_runner.Case(entry.seed, entry.index)
  assert (case.op.name, case.mutation) == (entry.op, entry.mutation), (
      f"seed {entry.seed} case {entry.index} is now {case.op.name} / {case.mutation}, "
      f"not {entry.op} / {entry.mutation}: the schedule moved; re-pin the entry")
  records = _run_case(entry.seed, entry.index)
  assert sorted(records) == [2 * entry.index, 2 * entry.index + 1]
  # findings() looks cases up by the index in each record.
  found = fuzz_cases.findings(entry.seed, records)
  assert not found, f"{entry.found}, again:\n" + "\n".join(f["text"] for f in found)


def test_every_regression_is_a_refused_case():
  """An entry is a finding's case: a mutation, not a valid call."""
  for entry in fuzz_regressions.REGRESSIONS:
    assert entry.mutation != "valid", entry


def _printed_seed(*args):
  import re  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {k: v for k, v in os.environ.items() if k != "FUZZ_SEED"}
  # --cases 0: the run's seed is drawn and printed, no case runs.
  out = subprocess.run([sys.executable, "-m", "tests.fuzz.fuzz_cases", "--cases", "0", *args],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300,
                       check=True)
  seeds = re.findall(r"tfde fuzz: seed (\d+),", out.stderr + out.stdout)
  assert seeds, out.stderr + out.stdout
  assert len(set(seeds)) == 1, seeds  # the same seed in the header and the summary
  return int(seeds[0])


def test_make_fuzz_draws_a_new_seed_each_run():
  """`make fuzz` (no FUZZ_SEED) explores: two runs, two seeds, each printed;
  --seed reproduces one."""
  first, second = _printed_seed(), _printed_seed()
  assert first != second
  assert _printed_seed("--seed", str(first)) == first
