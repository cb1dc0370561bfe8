#!/usr/bin/env bash
# The runs behind docs/results-h200.md, one stage per device call (each under 10 minutes).
#
#   scripts/h200_results.sh STAGE [STAGE ...]
#
# Stages (JSON, PNG and a log each, in $OUT, else /tmp/opgraph-h200):
#   winners-fp32   the four models, fp32: cudnn, gemm, fft, winograd, auto + PyTorch eager   (~3-5 min)
#   winners-mixed  the four models, tf32 and bf16: cudnn, auto + PyTorch eager              (~3-4 min)
#   layers         L1-L5, fp32 / tf32 / bf16: cudnn, gemm, fft, winograd, auto + PyTorch    (~2-3 min)
# (estimates from the H200's cuDNN and PyTorch figures in docs/gpu.md and ../shared/peers; the
#  autotuned column dominates: every cuDNN engine and every algorithm of every node is timed)
#   markdown       the tables of every JSON in the folder (results.md) and the plots
#
# Protocol: the seed's 10 timed calls per loop, 5 warm-ups (not 10, to fit the device budget;
# WARMUP=10 restores it). TIME_LIMIT (default 420 s) stops starting new columns before the
# call's 10-minute limit, and the JSON is rewritten after every column, so a stage that runs
# long still returns what it did. The columns of each stage can be changed with
# WINNERS_LOWERINGS, MIXED_LOWERINGS, LAYER_LOWERINGS (e.g. MIXED_LOWERINGS=auto to save time).
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
$PY -c "import opgraph" 2>/dev/null || $PY -m pip install -q --no-deps --no-build-isolation -e . || exit 2

bench() {  # bench NAME TIME_LIMIT ARGS...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    $PY -m opgraph.benchmarks.cli --device cuda --warmup "$WARMUP" --repeat "$REPEAT" \
        --time-limit "$limit" --format json --output "$LOG/$name.json" --plot "$LOG/$name.png" \
        "$@" 2>&1 | tee "$LOG/$name.log" | tail -n 40
}

for stage in "$@"; do
    case "$stage" in
        winners-fp32)
            bench winners-fp32 "$TIME_LIMIT" --suite winners --precision fp32 \
                --lowering "${WINNERS_LOWERINGS:-cudnn,gemm,fft,winograd,auto}" --compare torch ;;
        winners-mixed)
            bench winners-mixed "$TIME_LIMIT" --suite winners --precision tf32,bf16 --layout "${MIXED_LAYOUT:-nhwc}" \
                --lowering "${MIXED_LOWERINGS:-cudnn,auto}" --compare torch ;;
        layers)
            bench layers "$TIME_LIMIT" --suite layers --precision fp32,tf32,bf16 \
                --lowering "${LAYER_LOWERINGS:-cudnn,gemm,fft,winograd,auto}" --compare torch ;;
        markdown)
            $PY scripts/results_to_markdown.py "$LOG"/winners-*.json "$LOG"/layers.json \
                --plot "$LOG/results.png" > "$LOG/results.md" && echo "wrote $LOG/results.md" ;;
        *)
            echo "unknown stage $stage (winners-fp32, winners-mixed, layers, markdown)" >&2
            exit 2 ;;
    esac
done
