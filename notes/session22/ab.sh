#!/bin/bash
# Alternating runs of bench/sharded_bench.py (in-process, interleaved
# rounds) from the tree at the session's start (/tmp/s22/base, a worktree
# of 5a1b... with this tree's op library) and from this tree.
for i in 1 2 3; do
  for tree in /tmp/s22/base /work/main; do
    echo "== $tree run $i"
    (cd $tree && /work/main/.venv/bin/python bench/sharded_bench.py --no-processes --reps 20 2>&1 | grep "^N=" | cut -c1-62)
  done
done
