# The next stop's first call (.scratch/v7, archives named in .scratch/v7/COMMITS): experiment/overlap with
# TENSORFOLD_OVERLAP 0, 1 and 2 (programmatic dependent launch: off, early blocks, the launch only), and p8 (prompt chunks' attention in tiles of 8 rows)
# beside main in prefill. Everything under $OUT; tee keeps what ran if the call is cut short.
cat .scratch/v7/COMMITS; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; V=$PWD/.scratch/v7
python3 -c "import cuda.core, inspect; print('cuda.core', cuda.core.__version__, 'PSS' if 'programmatic_stream_serialization' in inspect.signature(cuda.core.LaunchConfig).parameters else 'no PSS')"
for v in main p8 overlap; do ln -sfn $PWD/tensorfold/models/tiny-shakespeare $V/$v/tensorfold/models/tiny-shakespeare; done
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 -u "${@:3}") 2>&1 | grep -v NumbaPerformanceWarning; }
t0=$(date +%s)
{
for i in 1 2; do for o in 0 1 2; do
echo "== decode overlap=$o $i (t=$(( $(date +%s) - t0 )) s)"
TENSORFOLD_OVERLAP=$o var overlap 110 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --json $OUT/decode-overlap$o-$i.json | grep -E "^decode round, 1[6 ]|^drafted|rror|Traceback" | cut -c1-220
done; done
for i in 1 2; do for v in main p8; do echo "== prefill $v $i (t=$(( $(date +%s) - t0 )) s)"; var $v 110 -m tensorfold.cli bench prefill --config 2B --no-peer --lengths 2048,16384 | grep -E "tok/s|rror" | head -4; done; done
echo "== contract overlap=1 (t=$(( $(date +%s) - t0 )) s)"; for f in rmsnorm quantize attention; do TENSORFOLD_OVERLAP=1 var overlap 60 -m tensorfold.cli contract --gpu --only $f | grep -E "^FAIL|^SUMMARY|rror"; done
echo "== contract p8 (t=$(( $(date +%s) - t0 )) s)"; var p8 100 -m tensorfold.cli contract --gpu --only attention_partial_tile | grep -E "^PASS|^FAIL|^SUMMARY|rror"
echo "== done (t=$(( $(date +%s) - t0 )) s)"
} 2>&1 | tee $OUT/next.txt | tail -c 11000
