#!/usr/bin/env bash
# Thirtieth session, fifth device call (inline on the warm machine; recorded here): ConvNeXt-tiny's
# profile with the one-kernel layer norm (after call 4).
. docs/results/h200-2026-12-05/device-setup.sh
timeout 200 opgraph-bench --profile --onnx tests/onnx/models/convnext_tiny.onnx --batch 128 --dtype bfloat16 --precision bf16 \
  --layout nhwc --json $R/c-profile-convnext.json > $R/c.log 2>&1
echo "profile rc=$? SECONDS=$SECONDS" >> $R/device.txt
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
