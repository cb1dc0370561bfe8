#!/usr/bin/env bash
# Prepared in the twenty-fifth session for the next one's first call (copy to .gl/, with the cache
# docs/results/h200-2026-12-05/autotune-cache.json.gz at .gl/cache.json.gz; carry [".whl", ".gl"]).
# (1) The two GPU tests whose failures this session fixed on the CPU only (layer norm's one-element
# rows under FMA contraction; the pool-argmax test's premise). (2) The fifteen GPU test files the
# twenty-fifth session's calls had no time for. (3) fuse_gpu alone (cut at 170 s this session, no
# failure). (4) GoogLeNet bf16 compiled twice: the second compile must print no "tuned on other
# kernel code" note (the reductions' kernel text changed in the twenty-fourth session).
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
END=${END:-575}
for f in layer_norm_gpu zero_copy_pool_gpu bf16_kernels memory_gpu held_stream_gpu device_resolution \
         reference_pool_cupy cudnn_fusion cudnn cudnn_batchnorm cublas_matmul_gpu cuda_kernels depthwise_gpu \
         depthwise_wgrad_gpu unfold_gpu peers_gpu pool_vector_gpu fuse_gpu; do
  left=$((END - SECONDS)); [ $left -lt 15 ] && { echo "$f not run: out of time" >> $R/device.txt; continue; }
  lim=$(( left < 240 ? left : 240 ))
  timeout $lim python3 -m pytest tests/gpu/test_$f.py -m gpu -q -rf -p no:cacheprovider > $R/t-$f.log 2>&1
  echo "$f rc=$? $(grep -E 'passed|failed|error' $R/t-$f.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
done
G="opgraph-bench --device cuda --warmup 2 --repeat 3 --no-per-layer --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto"
for k in 1 2; do
  left=$((END - SECONDS)); [ $left -lt 30 ] && { echo "googlenet compile $k not run: out of time" >> $R/device.txt; continue; }
  timeout $left $G --json $R/k$k-googlenet.json > $R/k$k.log 2>&1
  echo "googlenet compile $k rc=$? SECONDS=$SECONDS other-kernel-notes=$(cat $R/k$k.log $R/k$k-googlenet.json 2>/dev/null | grep -o 'other kernel' | wc -l)" >> $R/device.txt
done
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
