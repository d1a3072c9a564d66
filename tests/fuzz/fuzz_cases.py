"""Generated malformed inputs for every public op of tfde.ops, on both
backends (issue 18, point 2: fuzzing as a habit).

A case is a function of (seed, index): a valid call of one op with one
thing changed (its rank, its dtype, an empty tensor, an int64 extreme, a
negative or out-of-range value, non-monotone splits, NaN/Inf, a size that
would overflow int32 or an allocation, a mismatched count, ...). A numpy
oracle says what the call must give: either the result (the valid calls,
and malformed-looking ones that are valid, such as NaN weights), or that
the call must be refused.

Each case runs on the C++ kernels and on the pure-TF twins. One run of a
case on one backend is a job; jobs run in batches in a child process
(`python -m tests.fuzz.fuzz_cases --child --seed S --first J --last K`), which
prints one JSON line per finished job. The parent (`run`) reads them; when
the child dies of a signal (or hangs), the job after the last one reported
is the one that crashed: it is recorded as a crash, run once more alone to
confirm it, and the batch goes on from the next job in a new child. So a
crash is pinned to its case and is a finding, never a killed test run.

Children run under an address-space limit (MEMORY_CAP, 4 GiB unless
$TFDE_FUZZ_MEMORY_CAP says otherwise), so a case that asks for a huge
allocation cannot take the machine's memory; a result larger than the cap
must be refused (ResourceExhaustedError or InvalidArgumentError).

Per job the record holds the outcome:
  ok        the result equals the oracle's
  wrong     a result that differs from the oracle's
  accepted  a result for an input the oracle refuses
  error     an allowed error (InvalidArgumentError, ValueError,
            ResourceExhaustedError; TypeError for a wrong dtype or a wrong
            number of arguments) for an input the oracle refuses
  refused   an allowed error for an input the oracle accepts
  bad-error any other exception
  crash     the child died of a signal (or hung) in this job
and whether a table, slot or dynamic store changed on an error.

`make fuzz` runs `python -m tests.fuzz.fuzz_cases --cases N`, which draws a new
seed each run and prints it first (a fixed seed only finds what it found
once); `--seed S` (or FUZZ_SEED=S) reproduces a run. tests/fuzz/test_fuzz.py
runs a fixed seed as part of `make test`, and a finding's (seed, case)
becomes an entry of tests/fuzz/fuzz_regressions.py once fixed.

This module is the entry point and reports a run (findings, summary). The
rest lives beside it: fuzz_oracle.py (limits, verdicts, input checks,
comparing results and state, the Op base class), fuzz_ragged.py (the
ragged batch and its shared mutations), the cases per op family in
fuzz_ops_ids.py, fuzz_ops_combine.py, fuzz_ops_tables.py,
fuzz_ops_sparse_apply.py and fuzz_ops_dynamic.py, and fuzz_runner.py (the
schedule, Case, a job's outcome, the child and the parent).
"""

import argparse
import collections
import json
import os
import re
import secrets
import sys
import time

from tests.fuzz.fuzz_oracle import BACKENDS
from tests.fuzz.fuzz_runner import Case
from tests.fuzz.fuzz_runner import child_main
from tests.fuzz.fuzz_runner import run

# ---------------------------------------------------------------- findings


FAILING = ("crash", "wrong", "accepted", "bad-error", "setup-error")


def findings(seed, records):
  """Failures, as dicts (op, kind, who, mutation, index, detail, text):
  crashes, wrong results, accepted malformed input, disallowed errors
  (kind = the outcome), the state changed on an error ("state-changed"),
  and cases one backend refuses and the other does not ("disagree")."""
  out = []
  by_case = collections.defaultdict(dict)
  for r in records.values():
    by_case[r["index"]][r["backend"]] = r
  for index in sorted(by_case):
    jobs = by_case[index]
    case = Case(seed, index)
    where = f"case {index} ({case.describe()})"

    def add(kind, who, detail):
      out.append(dict(op=case.op.name, kind=kind, who=who, mutation=case.mutation,
                      index=index, detail=detail.strip(),
                      text=f"{who}: {kind}: {detail.strip()} -- {where}"))

    failing = {b: r for b, r in jobs.items() if r["outcome"] in FAILING}
    if len(failing) == 2 and len({r["outcome"] for r in failing.values()}) == 1:
      r = failing["kernels"]
      add(r["outcome"], "both", f"{r.get('error', '')} {r.get('detail', '')}")
    else:
      for backend, r in sorted(failing.items()):
        add(r["outcome"], backend, f"{r.get('error', '')} {r.get('detail', '')}")
    for backend, r in sorted(jobs.items()):
      if r.get("state_changed"):
        add("state-changed", backend, f"on {r.get('error')}: {r.get('detail')}")
    k, t = jobs.get("kernels"), jobs.get("reference")
    if k and t and "crash" not in (k["outcome"], t["outcome"]):
      refused = lambda r: r["outcome"] in ("error", "refused", "bad-error")
      if refused(k) != refused(t):
        who, r = ("kernels", k) if refused(k) else ("reference", t)
        add("disagree", f"only {who} refuses",
            f"{r.get('error', '')} {r.get('detail', '')}")
  return out


def _normalise(message):
  return re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "#", message)[:160]


def summary(seed, records, seconds=None):
  """A text summary: cases and jobs, outcomes, distinct errors, and the
  findings grouped by op, mutation, kind and backend, with an example."""
  lines = []
  cases = len({r["index"] for r in records.values()})
  outcomes = collections.Counter(r["outcome"] for r in records.values())
  errors = collections.Counter()
  for r in records.values():
    if r.get("error"):
      errors[(r["op"], r["error"], _normalise(r.get("detail", "")))] += 1
  found = findings(seed, records)
  took = f" in {seconds:.0f} s" if seconds is not None else ""
  lines.append(f"tfde fuzz: seed {seed}, {cases} cases tried ({len(records)} jobs: each "
               f"case on {' and '.join(BACKENDS)}){took}")
  lines.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
  lines.append(f"distinct errors: {len(errors)} (by op, type and message, numbers elided)")
  for (op, kind, message), n in sorted(errors.items()):
    lines.append(f"  {n:5d}  {op}: {kind}: {message}")
  groups = collections.defaultdict(list)
  for f in found:
    groups[(f["op"], f["mutation"], f["kind"], f["who"])].append(f)
  lines.append(f"findings: {len(found)} in {len(groups)} groups "
               "(op / mutation / kind / who: cases, an example)")
  for key, fs in sorted(groups.items()):
    example = fs[0]
    lines.append(f"  {' / '.join(key)}: {len(fs)} case(s) {[f['index'] for f in fs][:8]}")
    lines.append(f"      {example['detail'][:240]}")
    lines.append(f"      case {example['index']}: {Case(seed, example['index']).describe()[:300]}")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seed", type=int, default=None,
                      help="the run's seed (default: $FUZZ_SEED, else a new one each run)")
  parser.add_argument("--cases", type=int, default=int(os.environ.get("FUZZ_CASES", 3000)))
  parser.add_argument("--timeout", type=int, default=120, help="seconds per job")
  parser.add_argument("--no-confirm", action="store_true",
                      help="do not re-run a crashed job alone")
  parser.add_argument("--json", help="write every record to this file")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--last", type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.seed is None:
    args.seed = (int(os.environ["FUZZ_SEED"]) if os.environ.get("FUZZ_SEED")
                 else draw_seed())
  if args.child:
    return child_main(args)
  t0 = time.time()
  log = lambda text: print(text, file=sys.stderr, flush=True)
  log(f"tfde fuzz: seed {args.seed}, {args.cases} cases, each on both backends "
      f"(again: --seed {args.seed} --cases {args.cases})")
  records = run(args.seed, args.cases, args.timeout, not args.no_confirm, log)
  if args.json:
    with open(args.json, "w") as f:
      json.dump([records[j] for j in sorted(records)], f, indent=0)
  print(summary(args.seed, records, time.time() - t0))
  found = findings(args.seed, records)
  if found:
    print(f"a finding, once fixed, becomes a regression case: add (seed {args.seed}, "
          "its case index, op, mutation) to tests/fuzz/fuzz_regressions.py")
  return 1 if found else 0


def draw_seed():
  """A new seed for a run: 31 bits from the OS, so runs explore new cases."""
  return secrets.randbits(31)


if __name__ == "__main__":
  sys.exit(main())
