#!/usr/bin/env bash
# The twenty-seventh session's third device call, as run (the device tool's command line, one line there).
. docs/results/h200-2026-12-05/device-setup.sh
P="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --lowering auto --profile"
timeout 200 $P --model alexnet,overfeat,vgg_a --json $R/b-profile-winners.json > $R/b.log 2>&1
echo "profiles rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((440 - SECONDS))
timeout $left opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto \
  --compare torch-compile+graph --precision bf16 --dtype bfloat16 --model googlenet,alexnet \
  --json $R/c-bf16-googlenet-alexnet.json > $R/c.log 2>&1
echo "googlenet+alexnet rc=$? SECONDS=$SECONDS" >> $R/device.txt
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
