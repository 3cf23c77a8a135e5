cat .scratch/HEAD_COMMIT; V=$PWD/.scratch/v3; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F="NumbaPerformanceWarning|^  warn|grid size|low occupancy"
tf() { if [ $1 = head ]; then D=$PWD; else D=$V/$1; fi; shift; (cd $D && PYTHONPATH=/tmp/site:$D python3 -m tensorfold.cli "$@") 2>&1 | grep -v -E "$F"; }
run() { t=$1; shift; timeout $t bash -c "$(declare -f tf); F='$F'; V=$V; tf $*"; }
{ n=0; for v in main g16 main g16; do n=$((n+1)); echo "== decode $v"; run 60 $v bench decode --config 2B --no-peer --streams 1 --tokens 128 --cache /tmp/tfcache --json $OUT/decode-$v-$n.json | grep -E "^#.*(decode x|drafted round)"; done; } 2>&1 | tee $OUT/decode.txt
echo "== done"
