#!/usr/bin/env bash
# Prepared in the twenty-fourth session (no device was lent then), for after next-call.sh and
# next-call-2.sh: the networks imported from ONNX, which no session has timed since the issue's
# 2026-12-01 table (ResNet-50 from ONNX, BN folded: 220 ms auto+graph, 13x torch-compile+graph, float32
# storage then). (1) ResNet-50 from ONNX in bf16 beside torch-compile+graph (the peer runs the same
# imported forward graph in PyTorch). (2) ConvNeXt-tiny from ONNX (LayerNorm, Linear over channels-last
# tensors, layer scale: generated kernels since the twenty-fourth session) beside it. (3) GPU tests of
# the layer-norm kernels. The files are the repository's tests/onnx/models/ exports (weightless; the
# benchmark draws He-normal weights). Copy to .gl/ (cache: the latest returned, at .gl/cache.json.gz)
# and carry [".whl", ".gl"].
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
for f in tests/gpu/test_layer_norm_gpu.py; do
  [ -f "$f" ] || { echo "$f missing" >> $R/device.txt; continue; }
  timeout 90 python3 -m pytest "$f" -m gpu -q -rf -p no:cacheprovider > $R/t-$(basename $f .py).log 2>&1
  echo "$f rc=$? $(tail -n 1 $R/t-$(basename $f .py).log) SECONDS=$SECONDS" >> $R/device.txt
done
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision bf16 --dtype bfloat16 --batch 128"
left=$((575 - SECONDS)); timeout $(( left < 240 ? left : 240 )) $B --onnx tests/onnx/models/resnet50.onnx --json $R/a-onnx-resnet50.json > $R/a.log 2>&1
echo "onnx resnet50 rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((575 - SECONDS)); [ $left -gt 120 ] && { timeout $left $B --onnx tests/onnx/models/convnext_tiny.onnx --json $R/b-onnx-convnext_tiny.json > $R/b.log 2>&1; echo "onnx convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
