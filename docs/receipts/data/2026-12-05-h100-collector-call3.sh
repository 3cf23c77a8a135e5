cat .scratch/HEAD_COMMIT
H=$PWD
B=$PWD/.scratch/v/base
run_base() { (cd $B && PYTHONPATH=/tmp/site:$B python3 -m tensorfold.cli "$@"); }
echo "== chunk base"; run_base bench chunk --config 2B --streams 4 --prompt 4096 --chunks 128,512,2048 --json $OUT/chunk-base.json 2>&1 | grep -v -i warn | tail -5
echo "== decode 35B head"; python3 -m tensorfold.cli bench decode --config 35B-A3B --no-peer --streams 1,16 --json $OUT/decode-35b-head.json 2>&1 | grep -v -i warn | grep -v "^#   drawn" | tail -12
echo "== decode 35B base"; run_base bench decode --config 35B-A3B --no-peer --streams 1,16 --json $OUT/decode-35b-base.json 2>&1 | grep -v -i warn | tail -8
echo "== prefill 35B head"; python3 -m tensorfold.cli bench prefill --config 35B-A3B --no-peer --lengths 2048 2>&1 | grep "prefill 2,048"
echo "== prefill 35B base"; run_base bench prefill --config 35B-A3B --no-peer --lengths 2048 2>&1 | grep "prefill 2,048"
echo "== prefill 2B base"; run_base bench prefill --config 2B --no-peer --lengths 512,2048,16384 2>&1 | grep "#   tensorfold prefill"
echo "== prefill 2B head"; python3 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 512,2048,16384 2>&1 | grep "#   tensorfold prefill"
echo "== drafter head 256"; python3 -m tensorfold.cli bench drafter --backend cuda --json $OUT/drafter-256-head.json 2>&1 | grep -v -i warn | tail -8
