echo "variants of main 6c09b8d with ROUND_TILES 1/3/4"; nvidia-smi --query-gpu=name --format=csv,noheader; V=$PWD/.scratch/v2
var() { (cd $V/$1 && PYTHONPATH=/tmp/site:$V/$1 timeout $2 python3 "${@:3}") 2>&1 | grep -v -i warn; }
for v in main6c tiles1 tiles4 tiles3; do echo "== gemm $v"; var $v 60 -m tensorfold.cli bench gemm --config 2B --rows 1,16 --json $OUT/gemm-$v.json | grep -v copy | tail -14; done
for v in main6c tiles4 tiles1; do echo "== decode $v"; var $v 100 -m tensorfold.cli bench decode --config 2B --no-peer --streams 1,16 --tokens 64 --draft-rows 1 --json $OUT/decode-$v.json | grep "decode round, 1[6 ]" ; done
echo "== done"
