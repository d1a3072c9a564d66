"""tfde's first training step against the peers' own implementations
(bench/ops_bench.py's cross-check, run in the peers' environment, `make
peers-env`): from the same tables, ids, output gradients and learning
rate, the touched rows' deltas equal torch's (`optim.SGD`,
`optim.SparseAdam`, the lazy Adam) and FBGEMM TBE's (`EXACT_SGD`,
`EXACT_ROWWISE_ADAGRAD`; its CPU TBE has no Adam, torch no row-wise
Adagrad), and no peer touches another row. Skips where the
peers' environment is missing, unless TFDE_REQUIRE_PEERS=1 (`make test`).
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))
import ops_bench  # noqa: E402  pylint: disable=g-import-not-at-top


@pytest.mark.parametrize("optimizer, peers", [("sgd", ("torch", "fbgemm")),
                                              ("adam", ("torch",)),
                                              ("rowwise_adagrad", ("fbgemm",))])
def test_first_step_equals_the_peers(tmp_path, optimizer, peers):
  if not os.path.exists(ops_bench.PEERS_PYTHON):
    if os.environ.get("TFDE_REQUIRE_PEERS") == "1":
      pytest.fail(f"no peers' environment at {ops_bench.PEERS_PYTHON} (make peers-env)")
    pytest.skip("no peers' environment (make peers-env)")
  found = ops_bench.step_cross_check(str(tmp_path), optimizer)
  assert found is not None, "the peers' step failed (its error is printed above)"
  assert set(peers) <= set(found), found
  for peer in peers:
    rows, worst, largest = found[peer]
    assert rows > 100 and largest > 1e-3, (peer, found[peer])  # a real step
    # float32 rounding of the same arithmetic in another order, at most
    assert worst <= 1e-6 * max(1.0, largest), (peer, found[peer])
