cat .scratch/HEAD_COMMIT
H=$PWD
B=$PWD/.scratch/v/base
tf() { python3 -m tensorfold.cli "$@"; }
echo "== chunk head"; (cd $H && tf bench chunk --config 2B --streams 4 --prompt 4096 --chunks 128,512,2048 --json $OUT/chunk-head.json) 2>&1 | grep -v -i warn | tail -8
echo "== chunk base"; (cd $B && PYTHONPATH=/tmp/site:$B python3 -m tensorfold.cli bench chunk --config 2B --streams 4 --prompt 4096 --chunks 128,512,2048 --json $OUT/chunk-base.json) 2>&1 | grep -v -i warn | tail -8
echo "== prefill 2B head"; tf bench prefill --config 2B --no-peer --lengths 512,2048,16384 2>&1 | grep "prefill\|tok/s" | grep -v -i warn | tail -6
echo "== drafter phases head"; tf bench drafter --backend cuda --tokens 128 --phases --json $OUT/drafter-phases.json 2>&1 | grep -v -i warn | tail -16
echo "== observe profile"; python3 .scratch/observe_profile.py 128 2>&1 | grep -v -i warn | head -50 > $OUT/observe-profile.txt; head -45 $OUT/observe-profile.txt
echo "== prefill 35B head"; timeout 300 python3 -m tensorfold.cli bench prefill --config 35B-A3B --no-peer --lengths 2048 2>&1 | grep -v -i warn | tail -6
echo "== prefill 35B base"; (cd $B && PYTHONPATH=/tmp/site:$B timeout 200 python3 -m tensorfold.cli bench prefill --config 35B-A3B --no-peer --lengths 2048) 2>&1 | grep -v -i warn | tail -4
