#!/usr/bin/env bash
# Prepared in the twenty-fourth session (no device was lent then), after next-call-2.sh (whose tf32
# ResNet-50 run is the baseline): tf32 ResNet-50 with every cuDNN engine timed on the stem's
# backward-filter alone (stem-all-engines.toml, policy engine_limits; every other node's cached
# decision is reused), beside torch-compile+graph, then its profile. What would close the 1.018x
# (docs/results-h200.md, "where every target stands"): the stem's 0.697 ms against the peer's 0.48.
# Copy to .gl/ (cache: the latest returned, at .gl/cache.json.gz) and carry [".whl", ".gl"].
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
P=docs/results/h200-2026-12-05/stem-all-engines.toml
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --layout nhwc --lowering auto --precision tf32 --dtype float32 --model resnet50 --policy $P"
timeout 300 $B --cuda-graph --no-per-layer --compare torch-compile+graph --json $R/a-tf32-resnet50-stem.json > $R/a.log 2>&1
echo "tf32 resnet50, stem all engines rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((575 - SECONDS)); [ $left -gt 60 ] && { timeout $left $B --profile --json $R/b-profile-tf32-resnet50.json > $R/b.log 2>&1; echo "profile rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
