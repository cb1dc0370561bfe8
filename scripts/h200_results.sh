#!/usr/bin/env bash
# The runs behind docs/results-h200.md, one stage per device call (each under 10 minutes).
#
#   scripts/h200_results.sh STAGE [STAGE ...]
#
# Stages (JSON, PNG and a log each, in $OUT, else /tmp/opgraph-h200):
#   winners-fp32   the four models, fp32: cudnn, gemm, fft, winograd, auto + PyTorch eager   (~3-5 min)
#   winners-mixed  the four models, tf32 and bf16 ($MIXED_PRECISIONS): cudnn, auto ($MIXED_LOWERINGS)
#                  + PyTorch ($PEERS); one precision per call when every lowering is asked for
#                  (autotuning a large model takes ~90 s per precision on a bare machine)
#   layers         L1-L5, fp32 / tf32 / bf16: cudnn, gemm, fft, winograd, auto + PyTorch    (~2-3 min)
# (estimates from the H200's cuDNN and PyTorch figures in docs/gpu.md and ../shared/peers; the
#  autotuned column dominates: every cuDNN engine and every algorithm of every node is timed)
#   markdown       the tables of every JSON in the folder (results.md) and the plots
#   tests          the GPU tests (pytest -m gpu), log in pytest-gpu.log                    (~1 min)
#   kernels        scripts/gpu_kernel_bench.py: pool and bias-gradient variants (kernels.json) (~1 min)
#   codegen-bench  scripts/gpu_codegen_bench.py: ResNet-50's ($CODEGEN_MODEL=densenet121: DenseNet-121's)
#                  generated batch-norm kernels alone against the copy bandwidth, the reductions'
#                  TARGET_BLOCKS and the loops' UNROLL swept ($CODEGEN_DTYPE, default bfloat16;
#                  $CODEGEN_ARGS, e.g. "--blocks 1056,2112 --unroll 1,4")
#   profile        scripts/gpu_profile.py, GoogLeNet and VGG-A, fp32 NCHW and tf32 NHWC      (~1 min)
#   perf           the four models ($MODELS), auto ($PERF_LOWERINGS) + PyTorch eager ($PEERS), no
#                  per-layer view, in $PRECISIONS (default fp32) and $PERF_LAYOUT (default nchw):
#                  issue 7's side-by-side run; $PERF_NAME is appended to the file names
#   modern         ResNet-50, DenseNet-121, MobileNet-v2, EfficientNet-B0 ($MODELS), $MODERN_PRECISION (bf16:
#                  bf16 storage), NHWC, auto and auto+graph ($MODERN_LOWERINGS) + the four PyTorch peers ($PEERS)
#   modern-profile opgraph-bench --profile of $MODELS (default resnet50), $MODERN_PRECISION, NHWC, auto:
#                  each step timed alone (a CUDA-graph replay of it), per op type and direction against
#                  the copy bandwidth and matmul peak measured in the same run (profile-<precision>.json);
#                  reuses the carried cache; PROFILE_LOWERING replaces 'auto' (e.g. auto,exclude=bn-apply-remat
#                  with RUN_NAME=-noremat: a fusion rule's share, on the same cache)
#   peer-profile   scripts/gpu_peer_profile.py: torch.compile's training step of $MODELS (default
#                  densenet121) in $MODERN_PRECISION, NHWC, its kernels' device time per step grouped
#                  (cuDNN/cuBLAS/CUTLASS, Inductor's Triton, ATen): peer-profile-<precision>.json
#   default        opgraph-bench with no arguments but the output files
#
# The autotune cache is $LOG/autotune-cache.json (OPGRAPH_CACHE), seeded from
# .h200-autotune-cache.json in the repository root when that file exists (carry it to
# reuse an earlier call's decisions: the device starts bare every time).
#
# Protocol: the seed's 10 timed calls per loop, 5 warm-ups (not 10, to fit the device budget;
# WARMUP=10 restores it). TIME_LIMIT (default 420 s) stops starting new columns before the
# call's 10-minute limit, and the JSON is rewritten after every column, so a stage that runs
# long still returns what it did. The columns of each stage can be changed with
# WINNERS_LOWERINGS, MIXED_LOWERINGS, LAYER_LOWERINGS (e.g. MIXED_LOWERINGS=auto to save time);
# BENCH_ARGS adds flags to every opgraph-bench stage but default (e.g. BENCH_ARGS=--cuda-graph: a
# <lowering>+graph column per lowering, each phase replayed as CUDA graphs). GPU_TESTS narrows the
# tests stage (pytest arguments; default: the whole tests folder; GPU_TEST_K: a pytest -k expression). MODELS (default winners) narrows
# the winners-fp32, winners-mixed and perf stages, e.g. MODELS=googlenet; RUN_NAME is appended to
# the winners stages' file names.
# Installs carried wheels (.whl/) and opgraph first, as scripts/gpu_check.sh does.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp/opgraph-h200}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
WARMUP=${WARMUP:-5}
REPEAT=${REPEAT:-10}
TIME_LIMIT=${TIME_LIMIT:-420}

if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -c "import opgraph.passes, opgraph.benchmarks" 2>/dev/null || $PY -m pip install -q --no-deps --no-build-isolation -e . || exit 2
export OPGRAPH_CACHE=${OPGRAPH_CACHE:-$LOG/autotune-cache.json}
if [ -f .h200-autotune-cache.json ] && [ ! -f "$OPGRAPH_CACHE" ]; then
    cp .h200-autotune-cache.json "$OPGRAPH_CACHE"
fi

bench() {  # bench NAME TIME_LIMIT ARGS...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "${STAGE_TIMEOUT:-590}" $PY -m opgraph.benchmarks.cli --device cuda --warmup "$WARMUP" --repeat "$REPEAT" \
        --time-limit "$limit" --format json --output "$LOG/$name.json" --plot "$LOG/$name.png" \
        ${BENCH_ARGS:-} "$@" 2>&1 | tee "$LOG/$name.log" | tail -n 40
}

for stage in "$@"; do
    case "$stage" in
        winners-fp32)
            bench "winners-fp32${RUN_NAME:-}" "$TIME_LIMIT" --model "${MODELS:-winners}" --precision fp32 \
                --lowering "${WINNERS_LOWERINGS:-cudnn,gemm,fft,winograd,auto}" --compare torch ;;
        winners-mixed)
            bench "winners-$(echo "${MIXED_PRECISIONS:-tf32,bf16}" | tr , -)${RUN_NAME:-}" "$TIME_LIMIT" \
                --model "${MODELS:-winners}" \
                --precision "${MIXED_PRECISIONS:-tf32,bf16}" --layout "${MIXED_LAYOUT:-nhwc}" \
                --lowering "${MIXED_LOWERINGS:-cudnn,auto}" --compare "${PEERS:-torch}" ;;
        layers)
            bench layers "$TIME_LIMIT" --suite layers --precision fp32,tf32,bf16 \
                --lowering "${LAYER_LOWERINGS:-cudnn,gemm,fft,winograd,auto}" --compare torch ;;
        modern)
            # the modern suite (issue 15): one storage/compute precision per call ($MODERN_PRECISION: bf16
            # stores bf16, tf32 and fp32 store fp32), NHWC, auto and auto+graph beside the PyTorch peers
            p=${MODERN_PRECISION:-bf16}
            d=float32; [ "$p" = bf16 ] && d=bfloat16; [ "$p" = fp16 ] && d=float16
            bench "modern-$p${RUN_NAME:-}" "$TIME_LIMIT" --model "${MODELS:-modern}" --precision "$p" --dtype "$d" \
                --layout nhwc --lowering "${MODERN_LOWERINGS:-auto}" --cuda-graph --no-per-layer \
                --compare "${PEERS:-torch,torch+graph,torch-compile,torch-compile+graph}" ;;
        modern-profile)
            p=${MODERN_PRECISION:-bf16}
            d=float32; [ "$p" = bf16 ] && d=bfloat16; [ "$p" = fp16 ] && d=float16
            echo "== modern-profile $p ($(date -u +%H:%M:%S))"
            timeout "${STAGE_TIMEOUT:-590}" $PY -m opgraph.benchmarks.cli --profile --device cuda \
                --model "${MODELS:-resnet50}" --precision "$p" --dtype "$d" --layout nhwc \
                --lowering "${PROFILE_LOWERING:-auto}" \
                --warmup "$WARMUP" --repeat "$REPEAT" --format json --output "$LOG/profile-$p${RUN_NAME:-}.json" \
                2>&1 | tee "$LOG/profile-$p${RUN_NAME:-}.log" | tail -n 20 ;;
        peer-profile)
            p=${MODERN_PRECISION:-bf16}
            d=float32; [ "$p" = bf16 ] && d=bfloat16; [ "$p" = fp16 ] && d=float16
            echo "== peer-profile $p ($(date -u +%H:%M:%S))"
            timeout "${STAGE_TIMEOUT:-590}" $PY scripts/gpu_peer_profile.py --model "${MODELS:-densenet121}" \
                --dtype "$d" --precision "$p" --layout NHWC --json "$LOG/peer-profile-$p${RUN_NAME:-}.json" \
                2>&1 | tee "$LOG/peer-profile-$p${RUN_NAME:-}.log" | tail -n 60 ;;
        tests)
            echo "== tests ($(date -u +%H:%M:%S))"
            timeout "${GPU_TEST_TIMEOUT:-300}" $PY -m pytest ${GPU_TESTS:-tests} ${GPU_TEST_K:+-k "$GPU_TEST_K"} -m gpu -q \
                -ra -p no:cacheprovider --durations=10 >"$LOG/pytest-gpu${RUN_NAME:-}.log" 2>&1
            echo "gpu tests exit status: $?"
            tail -n 25 "$LOG/pytest-gpu${RUN_NAME:-}.log" ;;
        kernels)
            echo "== kernels ($(date -u +%H:%M:%S))"
            $PY scripts/gpu_kernel_bench.py --json "$LOG/kernels.json" ;;
        codegen-bench)
            echo "== codegen-bench ($(date -u +%H:%M:%S))"
            timeout "${STAGE_TIMEOUT:-590}" $PY scripts/gpu_codegen_bench.py --dtype "${CODEGEN_DTYPE:-bfloat16}" \
                --model "${CODEGEN_MODEL:-resnet50}" ${CODEGEN_ARGS:-} \
                --json "$LOG/codegen-bench-${CODEGEN_MODEL:-resnet50}-${CODEGEN_DTYPE:-bfloat16}.json" \
                > "$LOG/codegen-bench.log" 2>&1
            echo "codegen-bench exit status: $?"; tail -n 5 "$LOG/codegen-bench.log" ;;
        profile)
            echo "== profile ($(date -u +%H:%M:%S))"
            $PY scripts/gpu_profile.py --model googlenet --model vgg_a --json "$LOG/profile-fp32-nchw.json" \
                | tail -n 30
            $PY scripts/gpu_profile.py --model googlenet --model vgg_a --precision tf32 --layout NHWC \
                --json "$LOG/profile-tf32-nhwc.json" | tail -n 30 ;;
        perf)
            bench "perf-$(echo "${PRECISIONS:-fp32}" | tr , -)${PERF_NAME:-}" "$TIME_LIMIT" --model "${MODELS:-winners}" \
                --precision "${PRECISIONS:-fp32}" --layout "${PERF_LAYOUT:-nchw}" \
                --lowering "${PERF_LOWERINGS:-auto}" --compare "${PEERS:-torch}" --no-per-layer ;;
        default)
            echo "== default: opgraph-bench with no arguments ($(date -u +%H:%M:%S))"
            $PY -m opgraph.benchmarks.cli --format json --output "$LOG/default.json" --plot "$LOG/default.png" \
                2>&1 | tee "$LOG/default.log" | tail -n 60 ;;
        markdown)
            $PY scripts/results_to_markdown.py "$LOG"/winners-*.json "$LOG"/perf-*.json "$LOG"/layers.json \
                --plot "$LOG/results.png" > "$LOG/results.md" && echo "wrote $LOG/results.md" ;;
        *)
            echo "unknown stage $stage (winners-fp32, winners-mixed, layers, modern, modern-profile, tests, kernels, codegen-bench," \
                 "profile, perf," \
                 "default, markdown)" >&2
            exit 2 ;;
    esac
done
