#!/usr/bin/env bash
# Prepared in the twenty-second session for the next session's first device call (item 1 of
# docs/performance.md, "Next device session", after the twenty-second): every GPU test file on the
# final tree, one pytest per file under its own limit, so that one slow file cannot hide the rest.
# Copy to .gl/ with the cache at .gl/cache.json.gz (docs/results/h200-2026-12-05/autotune-cache.json.gz)
# and carry [".whl", ".gl"]. The -m gpu tests of tests/backends/ and tests/passes/ run in the last step.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export OPGRAPH_CACHE=/tmp/og-cache.json.gz
[ -f $OPGRAPH_CACHE ] || cp .gl/cache.json.gz $OPGRAPH_CACHE
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date) > $R/device.txt
files=("$@"); [ ${#files[@]} -gt 0 ] || files=(tests/gpu/test_*.py)  # a second call: the files the first had no time for
for f in "${files[@]}"; do
  left=$((570 - SECONDS)); [ $left -lt 20 ] && { echo "$f not run: out of time" >> $R/device.txt; continue; }
  lim=$(( left < 170 ? left : 170 ))
  timeout $lim python3 -m pytest "$f" -m gpu -q -rf -p no:cacheprovider > $R/t-$(basename $f .py).log 2>&1
  echo "$f rc=$? $(tail -n 1 $R/t-$(basename $f .py).log) SECONDS=$SECONDS" >> $R/device.txt
done
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
