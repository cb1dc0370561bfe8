#!/usr/bin/env bash
# Thirtieth session, second device call: tf32 of the four winners beside torch-compile+graph on the
# current tree. Their scorecard cells (0.957-0.992x) are the thirteenth session's, on the H200, before
# every kernel change since (pool argmax/scan, 16-byte column sums, tiled transpose, relu-bias-sums,
# rows in flight); the ones closest to 1.00 are the ones this run would catch going over.
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision tf32 --dtype float32"
for m in alexnet overfeat vgg_a googlenet; do
  left=$((585 - SECONDS)); [ $left -gt 60 ] || break
  timeout $(( left < 200 ? left : 200 )) $B --model $m --json $R/tf32-$m.json > $R/tf32-$m.log 2>&1
  echo "tf32 $m rc=$? SECONDS=$SECONDS" >> $R/device.txt
done
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
