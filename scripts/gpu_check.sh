#!/usr/bin/env bash
# The CUDA backend's check on a machine with an NVIDIA GPU, in one go (about 5-6 minutes on an H200):
#
#   1. install: with KF_OFFLINE_WHEELS=DIR, the wheels in DIR (pydantic and its dependencies at least) go into
#      a target folder on PYTHONPATH (pip --no-index --no-deps, or unpacked directly where there is no pip);
#      else `pip install -e .` where the network works; else the wheels in .kf/gpu-wheels, if there;
#   2. check that the CUDA judge imports (numpy, pydantic, psutil, cuda-python; CuPy for the library baseline)
#      and that a GPU is visible;
#   3. the GPU tests: python -m pytest -m gpu tests/test_cuda_gpu.py, with the project's pytest configuration
#      replaced (it needs pytest-asyncio, which a GPU machine may not have);
#   4. bench/cuda.py: a short search per CUDA problem; every figure printed with the command that made it,
#      the JSON document written to $OUT/cuda.json (or .kf/gpu-check/cuda.json).
#
# Environment: PYTHON (default python3), KF_OFFLINE_WHEELS, KF_BENCH_MINUTES (default 3), OUT.
# Every step runs even when an earlier one failed (each says what failed); the exit status is 1 if any did.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
RESULTS="${OUT:-$ROOT/.kf/gpu-check}"
BENCH_MINUTES="${KF_BENCH_MINUTES:-3}"
mkdir -p "$RESULTS"
STARTED=$(date +%s)
FAILED=()

step() { echo; echo "=== [$(( $(date +%s) - STARTED ))s] $* ==="; }
# Print the command, run it, remember a failure by name.
run() {
    local name="$1"; shift
    echo "+ $*"
    "$@"
    local status=$?
    if [ "$status" -ne 0 ]; then
        echo "!!! $name failed (exit status $status): $*"
        FAILED+=("$name")
    fi
    return "$status"
}

step "machine"
"$PYTHON" --version
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>} uid=$(id -u) results in $RESULTS"

step "install"
# Wheels for a machine without network: KF_OFFLINE_WHEELS, else the folder the lead carries along.
OFFLINE="${KF_OFFLINE_WHEELS:-}"
if [ -z "$OFFLINE" ] && [ -d "$ROOT/.kf/gpu-wheels" ]; then
    OFFLINE="$ROOT/.kf/gpu-wheels"
fi
online() {
    timeout 8 "$PYTHON" -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/pip/', timeout=5)" \
        >/dev/null 2>&1
}
install_wheels() {
    local site="${KF_SITE_DIR:-$ROOT/.kf/gpu-site}"
    mkdir -p "$site"
    shopt -s nullglob
    local wheels=() wheel
    for wheel in "$1"/*.whl; do
        # Only this machine's: platform wheels of another architecture may sit beside them.
        case "$(basename "$wheel")" in
            *-none-any.whl | *"$(uname -m)"*) wheels+=("$wheel") ;;
        esac
    done
    shopt -u nullglob
    if [ "${#wheels[@]}" -eq 0 ]; then
        echo "!!! $1 holds no .whl files"
        FAILED+=("install")
    else
        echo "+ $PYTHON -m pip install --no-index --no-deps --upgrade --target $site ${wheels[*]}"
        if ! "$PYTHON" -m pip install --quiet --no-index --no-deps --upgrade --target "$site" "${wheels[@]}"; then
            # No pip, or a pip that refuses: a wheel is a zip laid out for site-packages.
            echo "pip could not install the wheels; unpacking them into $site instead"
            for wheel in "${wheels[@]}"; do
                run "unpack $(basename "$wheel")" "$PYTHON" -m zipfile -e "$wheel" "$site"
            done
        fi
    fi
    export PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}"
}
if [ -n "${KF_OFFLINE_WHEELS:-}" ]; then
    install_wheels "$KF_OFFLINE_WHEELS"
elif online; then
    if ! run "install (pip install -e .)" timeout 600 "$PYTHON" -m pip install --quiet -e "$ROOT"; then
        if [ -n "$OFFLINE" ]; then
            install_wheels "$OFFLINE"
        else
            export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
        fi
    fi
elif [ -n "$OFFLINE" ]; then
    echo "no network: installing the wheels in $OFFLINE"
    install_wheels "$OFFLINE"
else
    echo "!!! no network and no wheels: set KF_OFFLINE_WHEELS=DIR to a folder of wheels (pydantic, pydantic-core," \
         "annotated-types, typing-extensions, typing-inspection); going on with the project on PYTHONPATH"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
echo "PYTHONPATH=${PYTHONPATH:-}"

step "imports and GPU"
run "imports" "$PYTHON" - <<'EOF'
import importlib
import sys

missing = []
for name in ("numpy", "pydantic", "psutil", "cuda.bindings.driver", "cuda.bindings.nvrtc"):
    try:
        module = importlib.import_module(name)
        print(f"{name}: {getattr(module, '__version__', '')} {getattr(module, '__file__', '')}")
    except Exception as error:
        missing.append(f"{name} ({type(error).__name__}: {error})")
try:
    import cupy

    print(f"cupy: {cupy.__version__} (the library baseline runs)")
except Exception as error:
    print(f"cupy: not importable ({type(error).__name__}: {error}): the library baseline will be skipped")
for name in ("engine.harness.cuda.judge", "engine.harness.cuda.compile", "engine.harness.backend"):
    try:
        importlib.import_module(name)
    except Exception as error:
        missing.append(f"{name} ({type(error).__name__}: {error})")
if missing:
    sys.exit("cannot import: " + "; ".join(missing))
from engine.harness.cuda.nvrtc import nvrtc_version
from engine.harness.sandbox import describe_isolation
from engine.targets import scan_gpus

print(f"NVRTC: {nvrtc_version()}")
print(f"sandbox: {describe_isolation()} (the CUDA child: no seccomp filter, no uid drop: see cuda/child.py)")
scan = scan_gpus()
if not scan.gpus:
    sys.exit(f"no GPU: {scan.reason}")
for gpu in scan.gpus:
    print(f"GPU {gpu.ordinal}: {gpu.name}, target {gpu.target}")
EOF

step "GPU tests"
run "GPU tests" timeout 270 "$PYTHON" -m pytest -c /dev/null --rootdir "$ROOT" -o "markers=gpu: needs an NVIDIA GPU" \
    -o timeout=150 -m gpu tests/test_cuda_gpu.py -p no:cacheprovider --noconftest -q -rs --durations=5

step "benchmark (bench/cuda.py, ${BENCH_MINUTES} min)"
run "bench/cuda.py" timeout 330 "$PYTHON" bench/cuda.py --minutes "$BENCH_MINUTES" --json-out "$RESULTS/cuda.json"
echo "JSON: $RESULTS/cuda.json"

step "done in $(( $(date +%s) - STARTED ))s"
if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "FAILED: ${FAILED[*]}"
    exit 1
fi
echo "all steps passed"
