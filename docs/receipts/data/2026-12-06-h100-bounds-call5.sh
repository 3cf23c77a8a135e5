cat .scratch/HEAD_COMMIT; V=$PWD/.scratch/v3; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
tf() { if [ $1 = head ]; then D=$PWD; else D=$V/$1; fi; shift; (cd $D && PYTHONPATH=/tmp/site:$D python3 -m tensorfold.cli "$@") 2>&1 | grep -v -E "$F"; }
run() { t=$1; shift; timeout $t bash -c "$(declare -f tf); F='$F'; V=$V; tf $*"; }
{ echo "== contract gemm_affine head"; run 100 head contract --gpu --only gemm_affine | tail -6
  echo "== contract experts4 head"; run 70 head contract --gpu --only experts4 | tail -3; } 2>&1 | tee $OUT/contract.txt
{ n=0; for v in main head g16 gwide main head; do n=$((n+1)); echo "== decode $v"; run 80 $v bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --cache /tmp/tfcache --json $OUT/decode-$v-$n.json | grep -E "^#.*(decode x|drafted round)"; done; } 2>&1 | tee $OUT/decode.txt
{ for v in main head g16 gwide; do echo "== bench gemm cold $v"; run 45 $v bench gemm --config 2B --rows 1 --json $OUT/gemm-cold-$v.json | tail -7; done; } > $OUT/gemm.txt 2>&1; cut -c1-20,37-120 $OUT/gemm.txt
(cd $OUT && tar czf json.tgz *.json && rm -f *.json); echo "== done"
