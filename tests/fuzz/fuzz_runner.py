"""The fuzz's cases and how they run (tests/fuzz/fuzz_cases.py describes the
whole): the ops and the schedule of (op, mutation) pairs, Case, one job
run in a child with its outcome, the child's main, and the parent that
runs jobs in children and pins a crash to its job.
"""

import functools
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time

import numpy as np

from tests.fuzz.fuzz_ops_combine import BagGradients
from tests.fuzz.fuzz_ops_combine import Combine
from tests.fuzz.fuzz_ops_combine import CombineGrad
from tests.fuzz.fuzz_ops_dynamic import DynamicStore
from tests.fuzz.fuzz_ops_ids import CheckIdRange
from tests.fuzz.fuzz_ops_ids import Partition
from tests.fuzz.fuzz_ops_ids import SampleKeys
from tests.fuzz.fuzz_ops_ids import SortedUniqueInRange
from tests.fuzz.fuzz_ops_ids import SplitSampleKeys
from tests.fuzz.fuzz_ops_ids import Unique
from tests.fuzz.fuzz_ops_sparse_apply import SparseApply
from tests.fuzz.fuzz_ops_tables import CombineFromTables
from tests.fuzz.fuzz_ops_tables import GatherFromTables
from tests.fuzz.fuzz_ops_tables import SplitRows
from tests.fuzz.fuzz_oracle import BACKENDS
from tests.fuzz.fuzz_oracle import MEMORY_CAP
from tests.fuzz.fuzz_oracle import Refuse
from tests.fuzz.fuzz_oracle import _may_refuse
from tests.fuzz.fuzz_oracle import _state_equal
from tests.fuzz.fuzz_oracle import describe
from tests.fuzz.fuzz_oracle import mismatch

OPS = [Unique(), Partition(), CheckIdRange(), SortedUniqueInRange(), Combine(), CombineGrad(),
       BagGradients(), SplitRows(), GatherFromTables(), CombineFromTables(), SparseApply(bags=False),
       SparseApply(bags=True), DynamicStore("lookup"), DynamicStore("apply"),
       DynamicStore("import_"), DynamicStore("evict"), DynamicStore("create"), SampleKeys(),
       SplitSampleKeys()]
OP_NAMES = [op.name for op in OPS]
# One cycle of cases: every op with each of its mutations once, and two
# valid calls.
PAIRS = [(op, m) for op in OPS for m in ["valid", "valid"] + sorted(op.MUTATIONS)]
CYCLE = len(PAIRS)


@functools.lru_cache(maxsize=16)
def _schedule(seed, cycle):
  """The order of the pairs in a cycle: each cycle shuffled by the seed."""
  return np.random.default_rng([seed, cycle, 7]).permutation(CYCLE)
ALLOWED = ("InvalidArgumentError", "ValueError", "ResourceExhaustedError")


# ---------------------------------------------------------------- cases


class Case:
  def __init__(self, seed, index):
    self.seed, self.index = seed, index
    self.op, self.mutation = PAIRS[_schedule(seed, index // CYCLE)[index % CYCLE]]
    self.category = "valid" if self.mutation == "valid" else self.op.MUTATIONS[self.mutation][0]
    rng = np.random.default_rng([seed, index, 1])
    for _ in range(50):
      inp = self.op.valid(rng)
      inp["_note"] = "valid"
      if self.mutation == "valid" or self.op.MUTATIONS[self.mutation][1](rng, inp):
        break
    else:
      inp["_note"] = "valid (the mutation never applied)"
      self.mutation, self.category = "valid", "valid"
    self.inputs = inp

  def describe(self):
    parts = [self.inputs["_note"]]
    for k, v in self.inputs.items():
      if not k.startswith("_") and k != "contents":
        parts.append(f"{k}={describe(v, 4)}")
    return "; ".join(parts)[:600]


def _error_kind(e):
  return type(e).__name__


def run_job(case, backend, tf, tfde):
  """Runs one case on one backend (in a child): the job's record."""
  op, inp = case.op, case.inputs
  record = dict(index=case.index, backend=backend, op=op.name, mutation=case.mutation,
                category=case.category)
  with tfde.ops.backend(backend):
    try:
      ctx = op.prepare(inp, tf, tfde)
    except Exception as e:  # noqa: BLE001 (a valid set-up must work)
      record.update(outcome="setup-error", detail=f"{_error_kind(e)}: {_first_line(e)}")
      return record
    del _may_refuse[:]
    try:
      want = op.oracle(inp)
      verdict = None
    except Refuse as r:
      want, verdict = None, str(r)
    either = "; ".join(_may_refuse)
    record["oracle"] = ("valid" if verdict is None and not either else
                        f"either (result or refusal): {either}" if verdict is None else
                        f"refuse: {verdict}")
    before = op.state(ctx)
    error = None
    try:
      got = op.call(inp, ctx, tf, tfde)
    except Exception as e:  # noqa: BLE001 (classified below)
      error = e
    try:
      after = op.state(ctx)
    except Exception as e:  # noqa: BLE001
      after = f"unreadable: {_error_kind(e)}: {_first_line(e)}"
  if error is not None:
    kind = _error_kind(error)
    record["error"] = kind
    record["detail"] = _first_line(error)
    allowed = kind in ALLOWED or (kind == "TypeError" and case.category in ("dtype", "arity"))
    if not allowed:
      record["outcome"] = "bad-error"
    else:
      record["outcome"] = "error" if verdict is not None or either else "refused"
    record["state_changed"] = not (isinstance(after, list) or after is None) or \
        not _state_equal(before, after)
    return record
  if verdict is not None:
    record["outcome"] = "accepted"
    record["detail"] = f"no error (the oracle refuses: {verdict})"
    return record
  problem = op.check(got, want, inp)
  if problem is None and "state" in want:
    if isinstance(after, str):
      problem = f"state {after}"
    else:
      problem = mismatch(after, want["state"], op.rtol, op.atol, "state")
  elif problem is None and before is not None and not _state_equal(before, after):
    problem = "the state changed"
  record["outcome"] = "ok" if problem is None else "wrong"
  if problem:
    record["detail"] = problem
  return record


def _first_line(e):
  text = str(e).strip() or repr(e)
  line = text.splitlines()[0] if text else ""
  # TF prefixes eager errors with the function node; keep the message.
  line = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", line)
  return line[:300]


def jobs_of(count):
  """Job j is case j // 2 on BACKENDS[j % 2]."""
  return 2 * count


def child_main(args):
  """Runs jobs [first, last) and prints one JSON line per job."""
  import resource  # pylint: disable=g-import-not-at-top
  resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP + (2 << 30), MEMORY_CAP + (2 << 30)))
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import tfde.ops  # pylint: disable=g-import-not-at-top
  if not tfde.ops.kernels_available():
    print(json.dumps(dict(fatal=f"op library unavailable: {tfde.ops.native.load_error()}")),
          flush=True)
    return 3
  print(json.dumps(dict(ready=True)), flush=True)
  for job in range(args.first, args.last):
    case = Case(args.seed, job // 2)
    backend = BACKENDS[job % 2]
    print(json.dumps(dict(start=job)), flush=True)
    t0 = time.time()
    record = run_job(case, backend, tf, tfde)
    record["job"] = job
    record["seconds"] = round(time.time() - t0, 3)
    print(json.dumps(record), flush=True)
  return 0


# ---------------------------------------------------------------- parent


def _run_child(seed, first, last, timeout, log):
  """Runs jobs [first, last) in one child: (records, the job it died in
  or None, how it died)."""
  cmd = [sys.executable, "-m", "tests.fuzz.fuzz_cases", "--child", "--seed", str(seed),
         "--first", str(first), "--last", str(last)]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # Without oneDNN's options TF uses its plain CPU allocator, which fails an
  # allocation at once; oneDNN's retries one for 10 s before
  # ResourceExhaustedError.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0",
             PYTHONWARNINGS="ignore")
  env.pop("TFDE_OPS", None)
  with tempfile.TemporaryFile() as err:
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=err)
    records, started, buffer = [], None, b""
    deadline = time.time() + timeout + 120  # the first job also waits for TF's import
    died = None
    while True:
      ready, _, _ = select.select([proc.stdout], [], [], 1.0)
      if ready:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
          break
        buffer += chunk
        while b"\n" in buffer:
          line, buffer = buffer.split(b"\n", 1)
          try:
            msg = json.loads(line)
          except ValueError:
            continue
          if "fatal" in msg:
            proc.kill()
            proc.wait()
            raise RuntimeError(msg["fatal"])
          if "start" in msg:
            started = msg["start"]
            deadline = time.time() + timeout
          elif "job" in msg:
            records.append(msg)
            started = None
      elif time.time() > deadline:
        proc.kill()
        died = f"hang (no result in {timeout} s)"
        break
    rc = proc.wait()
    err.seek(0)
    why = _why(err.read().decode(errors="replace"))
  if died is None and rc != 0:
    died = (f"signal {-rc} ({_signal_name(-rc)})" if rc < 0 else f"exit code {rc}")
  if died is None:
    return records, None, None
  done = records[-1]["job"] + 1 if records else first
  crashed = started if started is not None else done
  how = f"{died}: {why}" if why else died
  if log:
    log(f"  job {crashed} died: {how}")
  return records, crashed, how


def _why(stderr):
  """The line of a child's stderr that says why it died, if any."""
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  for pattern in (r"Check failed", r"terminate called|what\(\):", r"^F\d{4} ",
                  r"Fatal Python error", r"Error|error"):
    hits = [l for l in lines if re.search(pattern, l)]
    if hits:
      return re.sub(r"^[FEW]\d{4} [\d:.]+\s+\d+ ", "", hits[-1])[:300]
  return ""


def _signal_name(sig):
  import signal  # pylint: disable=g-import-not-at-top
  try:
    return signal.Signals(sig).name
  except ValueError:
    return "?"


def _crash_record(seed, job, how, confirmed):
  case = Case(seed, job // 2)
  return dict(job=job, index=case.index, backend=BACKENDS[job % 2], op=case.op.name,
              mutation=case.mutation, category=case.category, outcome="crash",
              detail=how + ("" if confirmed else
                            " (not when run again alone: intermittent, or set off by an "
                            "earlier job in the same process)"))


def run(seed, count, timeout=120, confirm=True, log=None):
  """Every job of cases [0, count) under `seed`: records, by job."""
  total = jobs_of(count)
  records = {}
  first = 0
  while first < total:
    got, crashed, how = _run_child(seed, first, total, timeout, log)
    for r in got:
      records[r["job"]] = r
    if crashed is None:
      break
    confirmed = True
    if confirm:
      _, again, _ = _run_child(seed, crashed, crashed + 1, timeout, None)
      confirmed = again == crashed
    records[crashed] = _crash_record(seed, crashed, how, confirmed)
    first = crashed + 1
  for job in range(total):
    if job not in records:
      records[job] = _crash_record(seed, job, "no record", True)
  return records
