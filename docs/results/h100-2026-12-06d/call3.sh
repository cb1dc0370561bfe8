#!/usr/bin/env bash
# Thirtieth session, third device call (typed inline on the warm machine; recorded here): tf32 of
# MobileNet-v2, EfficientNet-B0 and DenseNet-121 beside torch-compile+graph within 330 s
# (DenseNet-121 ran out of that time: its log shows how far it got).
. docs/results/h200-2026-12-05/device-setup.sh
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision tf32 --dtype float32"
for m in mobilenet_v2 efficientnet_b0 densenet121; do
  left=$((330 - SECONDS)); [ $left -gt 60 ] || break
  timeout $left $B --model $m --json $R/tf32-$m.json > $R/tf32-$m.log 2>&1
  echo "tf32 $m rc=$? SECONDS=$SECONDS" >> $R/device.txt
done
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
