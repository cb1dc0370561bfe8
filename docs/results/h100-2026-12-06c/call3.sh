#!/usr/bin/env bash
# Twenty-ninth session, third device call: call 2's ConvNeXt-tiny run went out of memory in the
# per-node check (the check kept every value the reference does not keep, 42 GB of float64 with
# bias-remat's chains); the check now drops them after their step. ConvNeXt-tiny again beside
# torch-compile+graph (bias-remat: predicted 28.3 -> ~26.3 ms).
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
M=tests/onnx/models/convnext_tiny.onnx
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision bf16 --dtype bfloat16"
timeout ${T:-300} $B --batch 128 --onnx $M --json $R/a-onnx-convnext_tiny.json > $R/a.log 2>&1
echo "onnx convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
