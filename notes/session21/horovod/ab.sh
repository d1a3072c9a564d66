# Alternating A/B of the Horovod 2-process step: HEAD's tfde (old) against the work tree's (new).
cd /tmp/h21
for round in 1 2 3; do
  for v in old new; do
    rm -rf ab/$v$round; mkdir -p ab/$v$round
    PYTHONPATH=/tmp/h21/hvdsrc$([ $v = old ] && echo ${SUFFIX_OLD:-_old}) timeout 600 /work/main/.venv-hvd/bin/horovodrun -np 2 --gloo -H localhost:2 /work/main/.venv-hvd/bin/python bench/sharded_bench.py --worker horovod --worker-out ab/$v$round --reps 10 --exchange ${EXCHANGE:-auto} > ab/$v$round.log 2>&1
    echo "$round $v $(cat ab/$v$round/worker_0.json 2>/dev/null) $(cat ab/$v$round/worker_1.json 2>/dev/null)"
  done
done
