#!/usr/bin/env bash
# device call 1 (seventeenth session): the two GPU test failures, fp32 VGG-A NCHW, fp32 ResNet-50/DenseNet NHWC +graph, ncu of the pool kernels
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c docs/results/h200-2026-12-04b/autotune-cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 100 python3 -m pytest tests/gpu/test_cublas_matmul_gpu.py tests/gpu/test_cudnn_batchnorm.py -m gpu -q -rf -p no:cacheprovider --timeout 60 > $R/a-pytest.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
timeout 60 python3 .gl/ncu_pool.py --time > $R/b-pool-times.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
timeout 90 ncu --clock-control none -k regex:opgraph_pool_vec --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python3 .gl/ncu_pool.py > $R/c-ncu.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10"
timeout 110 $B --cuda-graph --no-per-layer --model vgg_a --precision fp32 --dtype float32 --layout nchw --lowering auto --compare torch --json $R/d-vgg-fp32.json > $R/d.log 2>&1
echo "d rc=$? $(date)" >> $R/device.txt
timeout 80 $B --profile --model vgg_a --precision fp32 --dtype float32 --layout nchw --lowering auto --json $R/e-vgg-fp32-profile.json > $R/e.log 2>&1
echo "e rc=$? $(date)" >> $R/device.txt
timeout 150 $B --cuda-graph --no-per-layer --model resnet50,densenet121 --precision fp32 --dtype float32 --layout nhwc --lowering auto --compare torch --json $R/f-fp32-modern.json > $R/f.log 2>&1
echo "f rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call1.tgz -C $R .
