"""The memory of a dynamic table that admits and evicts stays flat while
delta exports, and delta checkpoints with them, follow it: each consumer
takes its evicted ids and the record lets them go (before, an export
chain's record grew by an entry an eviction: 632 to 709 MB resident over
these 60 cycles, 1.4 million ids on record). Run in a fresh process each,
so that the resident size is this run's alone."""

import json
import os
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "delta_memory_worker.py")
ROWS, CYCLES, WARMUP = 20_000, 60, 10
# memory_bytes() a row of this table (dim 8, adagrad: 64 bytes of values
# and slots, the rest the store's index and counters): 298 today; a change
# that raises it fails here rather than in a benchmark weeks later.
BYTES_PER_ROW = 320


@pytest.mark.parametrize("mode", ["exports", "both"])
def test_resident_memory_is_flat_over_admit_evict_cycles(tmp_path, mode):
  env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(WORKER)))))
  run = subprocess.run([sys.executable, WORKER, str(tmp_path), mode, str(ROWS), str(CYCLES),
                        str(WARMUP)], capture_output=True, text=True, env=env, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads([l for l in run.stdout.splitlines() if l.startswith("RESULT")][-1][6:])
  assert result["rows"] == ROWS, result
  assert result["on_record"] <= ROWS, result        # one cycle's evictions at most
  assert result["end"] <= 1.05 * result["after_warmup"], result
  assert result["memory_bytes"] <= 1.05 * result["memory_bytes_after_warmup"], result
  assert result["memory_bytes"] / ROWS <= BYTES_PER_ROW, result
