cat .scratch/HEAD_COMMIT
P=$PWD/.scratch/v/prev
echo "== gate log head"; python3 .scratch/gate_log.py 128 T=0.8 2>&1 | grep -v -i warn | tee $OUT/gate-log-head.txt | grep -v "seq:"
echo "== drafter head"; python3 -m tensorfold.cli bench drafter --backend cuda --json $OUT/drafter-head.json 2>&1 | grep -v -i warn | tail -8
echo "== drafter prev"; (cd $P && PYTHONPATH=/tmp/site:$P python3 -m tensorfold.cli bench drafter --backend cuda --json $OUT/drafter-prev.json) 2>&1 | grep -v -i warn | tail -8
