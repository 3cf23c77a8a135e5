cat .scratch/HEAD_COMMIT
B=$PWD/.scratch/v/base
run_base() { (cd $B && PYTHONPATH=/tmp/site:$B python3 -m tensorfold.cli "$@"); }
echo "== all 35B head"; python3 -m tensorfold.cli bench all --config 35B-A3B --no-peer --streams 1,16 --lengths 2048 --json $OUT/all-35b-head.json 2>&1 | grep -v -i warn | grep "tok/s\|prefill 2" 
echo "== all 35B base"; run_base bench all --config 35B-A3B --no-peer --streams 1,16 --lengths 2048 --json $OUT/all-35b-base.json 2>&1 | grep -v -i warn | grep "tok/s\|prefill 2"
echo "== pytest --gpu"; TENSORFOLD_GRAPHS=1 python3 -m pytest --gpu -q -p no:cacheprovider tests/test_replay_reuse.py 2>&1 | tail -3
