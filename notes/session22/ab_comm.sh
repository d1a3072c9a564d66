#!/bin/bash
# Alternating runs of bench/sharded_bench.py (in-process, interleaved
# rounds): this tree with MirroredCommunicator's reduce_scatter and
# all_gather removed (/tmp/s22/konly: the key kernels only), and this tree.
for i in 1 2 3; do
  for tree in /tmp/s22/konly /work/main; do
    echo "== $tree run $i"
    (cd $tree && /work/main/.venv/bin/python bench/sharded_bench.py --no-processes --reps 20 2>&1 | grep "^N=" | cut -c1-62)
  done
done
