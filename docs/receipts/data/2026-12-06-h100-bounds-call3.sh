cat .scratch/HEAD_COMMIT; V=$PWD/.scratch/v3; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
tf() { if [ $1 = head ]; then D=$PWD; else D=$V/$1; fi; shift; (cd $D && PYTHONPATH=/tmp/site:$D python3 -m tensorfold.cli "$@") 2>&1 | grep -v -E "$F"; }
{ echo "== contract gemm_affine head"; timeout 150 bash -c "$(declare -f tf); F='$F'; V=$V; tf head contract --gpu --only gemm_affine" | tail -3
  echo "== contract expert head"; timeout 120 bash -c "$(declare -f tf); F='$F'; V=$V; tf head contract --gpu --only expert" | tail -3; } 2>&1 | tee $OUT/contract.txt
{ for v in head noahead; do echo "== bench gemm cold $v"; timeout 100 bash -c "$(declare -f tf); F='$F'; V=$V; tf $v bench gemm --config 2B --rows 1,16 --json $OUT/gemm-cold-$v.json" | tail -16; done
  echo "== bench gemm warm head"; timeout 60 bash -c "$(declare -f tf); F='$F'; V=$V; tf head bench gemm --config 2B --rows 1 --cold-mib 0" | tail -8; } 2>&1 | tee $OUT/gemm.txt
{ n=0; for v in noahead head noahead head; do n=$((n+1)); echo "== decode $v"; timeout 100 bash -c "$(declare -f tf); F='$F'; V=$V; tf $v bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --cache /tmp/tfcache --json $OUT/decode-$v-$n.json" | grep -E "decode|round"; done; } 2>&1 | tee $OUT/decode.txt
echo "== done"
