#!/usr/bin/env bash
# Twenty-eighth session, third device call (the first two ran the prepared
# docs/results/h100-2026-12-06/next-call.sh and next-call-2.sh; their results are in call1/, call2/).
# (1) ConvNeXt-tiny from ONNX ran 1.74x torch-compile+graph in bf16 (56.7 against 32.5 ms) with a
# forward of 39 ms against a backward of 17.5: where our step's time goes (--profile) and the peer's
# (scripts/gpu_peer_profile.py, which now takes ONNX files). (2) tf32 ResNet-50 again: its backward-data
# did not fit the H100 as one CUDA graph (the forward's replaced arrays idle in the default pool);
# each capture now gives the default pool's idle blocks back first.
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
M=tests/onnx/models/convnext_tiny.onnx
timeout 200 opgraph-bench --profile --onnx $M --batch 128 --dtype bfloat16 --precision bf16 --layout nhwc \
  --json $R/a-profile-convnext_tiny.json > $R/a.log 2>&1
echo "profile convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt
timeout 120 python3 scripts/gpu_peer_profile.py --model $M --batch 128 --top 40 --json $R/b-peer-profile-convnext_tiny.json > $R/b.log 2>&1
echo "peer profile convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --model resnet50"
left=$((575 - SECONDS)); [ $left -gt 150 ] && { timeout $left $B --precision tf32 --dtype float32 --json $R/c-tf32-resnet50.json > $R/c.log 2>&1; echo "tf32 resnet50 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
