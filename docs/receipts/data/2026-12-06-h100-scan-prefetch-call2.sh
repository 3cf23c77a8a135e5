# Second call: the overlap branch's suite under --gpu with recordings on, its failures named (-rfE, junit XML), then the
# failing tests' files again with the overlap off. ~560 s.
V=$PWD/.scratch/v8; ln -sfn $PWD/tensorfold/models/tiny-shakespeare $V/overlap/tensorfold/models/tiny-shakespeare
t0=$(date +%s)
(cd $V/overlap && TENSORFOLD_GRAPHS=1 PYTHONPATH=/tmp/site:$V/overlap timeout 420 python3 -m pytest --gpu -n 15 --timeout 100 -v -rfE -p no:cacheprovider --junitxml=$OUT/overlap-suite.xml 2>&1 | grep -v -i warn > $OUT/overlap-suite.txt)
grep -E "FAILED|ERROR|passed|failed" $OUT/overlap-suite.txt | cut -c1-300 | tail -40
FAILING=$(grep -E "\] FAILED " $OUT/overlap-suite.txt | sed 's/.* FAILED //' | awk '{print $1}' | sed 's/::.*//' | sort -u | tr '\n' ' ')
echo "== the failing files with TENSORFOLD_OVERLAP=0 (t=$(( $(date +%s) - t0 )) s): $FAILING"
[ -n "$FAILING" ] && (cd $V/overlap && TENSORFOLD_OVERLAP=0 TENSORFOLD_GRAPHS=1 PYTHONPATH=/tmp/site:$V/overlap timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest --gpu -n 15 --timeout 100 -q -rfE -p no:cacheprovider $FAILING 2>&1 | grep -E "^FAILED|^ERROR|passed|failed" | cut -c1-300)
echo "== done (t=$(( $(date +%s) - t0 )) s)"
