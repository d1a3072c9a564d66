"""The planner's projection for a Criteo-1TB-sized DLRM (docs/SCALING.md):
26 tables of the Criteo Terabyte vocabularies (about 882M rows) at width
128 with Adagrad, global batch 65,536, one id per sample per table, on 8
to 1,024 devices with 80 GB each for rows and slots. Prints, per device
count, the plan's kinds, rows + slots per device (max), bytes sent per
device per step, and the estimated step time of its embeddings.

Also checks the estimate's bytes against what this machine's communicator
counts for the planner benchmark's workload (bench/planner_bench.py).
Planning only (no tables are built), so it runs in seconds:

    python bench/scaling_projection.py [--optimizer rowwise_adagrad]

`--optimizer rowwise_adagrad` plans the same model with TorchRec's default
optimizer, one accumulator per row (4 bytes) where Adagrad keeps a row's
width.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tfde  # noqa: E402
from tfde import planner  # noqa: E402

# Criteo Terabyte (days 0-23), distinct values per categorical feature.
CRITEO_1TB = [227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467,
              3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 292775614,
              40790948, 187188510, 590152, 12973, 108, 36]
GLOBAL_BATCH = 65_536
WIDTH = 128
DEVICE_BYTES = 80 * 10**9
# A GPU cluster: 50 GB/s per device all-to-all (NVLink within a node,
# 400 Gb/s InfiniBand across), 30 us a collective round.
GPU_COST = planner.CostModel(bandwidth_bytes_per_s=50e9, exchange_latency_s=30e-6,
                             memory_bytes_per_s=1.5e12, table_overhead_s=10e-6)


def features(batch_per_device, optimizer="adagrad"):
  return [tfde.FeatureConfig(
      name=f"c{i}", input_shape=(batch_per_device, 1), table=tfde.TableConfig(
          name=f"c{i:02d}", vocabulary_size=v, embedding_dim=WIDTH,
          optimizer=optimizer)) for i, v in enumerate(CRITEO_1TB)]


def project(optimizer="adagrad"):
  opt = tfde.optimizers.get(optimizer)
  slot_bytes = 4 * len(opt.slot_names) * opt.slot_shape([1, WIDTH]).num_elements()
  print(f"{sum(CRITEO_1TB) / 1e6:.0f}M rows x {WIDTH}, {optimizer}: "
        f"{sum(CRITEO_1TB) * (WIDTH * 4 + slot_bytes) / 1e9:.0f} GB of rows + slots; "
        f"global batch {GLOBAL_BATCH}")
  print(f"{'devices':>8} {'kinds':<44} {'GB/device':>10} {'MB sent/device':>15} "
        f"{'est. ms':>8}")
  rows = []
  for n in (8, 16, 32, 64, 128, 256, 512, 1024):
    try:
      plan = planner.plan(features(GLOBAL_BATCH // n, optimizer), n,
                          memory_per_replica_bytes=DEVICE_BYTES, cost_model=GPU_COST)
    except planner.PlanError as e:
      print(f"{n:>8} does not fit: {e}")
      continue
    kinds = {}
    for layout in plan.tables.values():
      kinds[layout.kind] = kinds.get(layout.kind, 0) + 1
    held = max(plan.per_replica["bytes_held"]) / 1e9
    sent = max(plan.per_replica["bytes_exchanged"]) / 2 / 1e6
    rows.append((n, kinds, held, sent, plan.estimated_step_seconds * 1e3))
    print(f"{n:>8} {str(kinds):<44} {held:>10.1f} {sent:>15.1f} "
          f"{plan.estimated_step_seconds * 1e3:>8.2f}")
  return rows


def check_against_this_machine():
  """The estimate's bytes against the communicator's count for the
  planner benchmark's workload, all row-wise (exact ids: sample given)."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import planner_bench  # pylint: disable=g-import-not-at-top
  configs, ids = planner_bench.workload(48, 200_000)
  sample = {f: planner_bench.ragged(v, l) for f, (v, l) in ids.items()}
  for n in (2, 4):
    for exchange in ("auto", "rows"):
      plan = planner.simple_plan(configs, n, "row_wise", sample_inputs=sample,
                                 exchange=exchange)
      estimated = sum(l.estimate["bytes_exchanged_per_step"] for l in plan.tables.values())
      print(f"planner benchmark workload, N={n}, all row-wise, exchange={exchange}: "
            f"estimated {estimated / 1e6:.2f} MB sent per step")


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--optimizer", default="adagrad", choices=["adagrad", "rowwise_adagrad"])
  project(parser.parse_args().optimizer)
  check_against_this_machine()
