#!/usr/bin/env bash
# Prepared in the twenty-second session, reordered in the twenty-third (no device was lent then): the
# next session's first call, the final tree's first GPU run. (1) GoogLeNet bf16 compiled twice on the
# carried cache: the first re-tunes the codegen nodes whose key predates the per-node fingerprint (notes
# "tuned on other kernel code"), the second must reuse every decision (no such note). (2) Every GPU test
# file, the ones touched since 2b956fd first, one pytest per file under its own limit (whatever has no
# time left is listed in device.txt: run those in a later call).
# Copy to .gl/ with the cache at .gl/cache.json.gz (docs/results/h200-2026-12-05/autotune-cache.json.gz)
# and carry [".whl", ".gl"].
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
B="opgraph-bench --device cuda --warmup 2 --repeat 3 --no-per-layer --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto"
for k in 1 2; do
  timeout 150 $B --json $R/k$k-googlenet.json > $R/k$k.log 2>&1
  echo "compile $k rc=$? SECONDS=$SECONDS other-kernel-notes=$(cat $R/k$k.log $R/k$k-googlenet.json 2>/dev/null | grep -o "other kernel" | wc -l)" >> $R/device.txt
done
for f in codegen_gpu fuse_gpu models_gpu pool_scan_gpu relu_bias_sums_gpu cuda_graph capture_gpu profile_gpu \
         zero_copy_pool_gpu bf16_kernels memory_gpu held_stream_gpu device_resolution reference_pool_cupy \
         cudnn_fusion cudnn cudnn_batchnorm cublas_matmul_gpu cuda_kernels depthwise_gpu depthwise_wgrad_gpu \
         unfold_gpu peers_gpu pool_vector_gpu; do
  left=$((575 - SECONDS)); [ $left -lt 15 ] && { echo "$f not run: out of time" >> $R/device.txt; continue; }
  lim=$(( left < 170 ? left : 170 ))
  timeout $lim python3 -m pytest tests/gpu/test_$f.py -m gpu -q -rf -p no:cacheprovider > $R/t-$f.log 2>&1
  echo "$f rc=$? $(tail -n 1 $R/t-$f.log) SECONDS=$SECONDS" >> $R/device.txt
done
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
