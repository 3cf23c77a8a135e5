set -x
cat .scratch/HEAD_COMMIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 --version
(time python3 .scratch/gate_log.py 128 T=0.8) > $OUT/gate-log.txt 2>&1; tail -30 $OUT/gate-log.txt
(time python3 .scratch/gc_census.py 2B) > $OUT/gc-census-2b.txt 2>&1; tail -30 $OUT/gc-census-2b.txt
(time python3 -m tensorfold.cli bench drafter --backend cuda --tokens 128 --json $OUT/drafter.json) > $OUT/drafter.txt 2>&1; tail -12 $OUT/drafter.txt
