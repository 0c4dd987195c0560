#!/usr/bin/env bash
# The GPU check kit (issue 16): on one machine with 1 to 8 NVIDIA GPUs, install what the CUDA paths
# need, run the CUDA test subset (tests/test_cuda.py: the NCCL group, decode CUDA graphs, the torch
# executor on CUDA against the CPU float64 reference's tokens, deep_ep dispatch when it installs,
# all_to_all otherwise) and write bench/results/gpu.md with what ran and what it measured.
#
#   bash bench/gpu/check.sh            # from anywhere; about 3-8 minutes, most of it the CUDA wheel
#
# Environment: GPU_CHECK_VENV (default .venv-gpu), GPU_CHECK_BUDGET_S (default 480: the pytest run
# gets what the install left), PYTHON (default python3.11), NVIDIA_SMI (default nvidia-smi).
# Exit codes: 0 every check passed, 1 a check failed, 2 no GPU here (nothing installed or run),
# 3 the install failed.
set -euo pipefail

started=$(date +%s)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
venv=${GPU_CHECK_VENV:-.venv-gpu}
budget=${GPU_CHECK_BUDGET_S:-480}
python=${PYTHON:-python3.11}
smi=${NVIDIA_SMI:-nvidia-smi}
results=bench/results/gpu.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { printf 'gpu check: %s\n' "$*"; }

if ! command -v "$smi" >/dev/null 2>&1; then
    echo "bench/gpu/check.sh: no NVIDIA GPU here ($smi not found): nothing installed, nothing run." >&2
    echo "Run it on a machine with 1 to 8 NVIDIA GPUs and their driver." >&2
    exit 2
fi
if ! "$smi" -L >"$work/gpus.txt" 2>&1 || ! grep -q '^GPU ' "$work/gpus.txt"; then
    echo "bench/gpu/check.sh: no NVIDIA GPU here ($smi -L lists none): nothing installed, nothing run." >&2
    sed 's/^/  /' "$work/gpus.txt" >&2
    exit 2
fi
gpus=$(grep -c '^GPU ' "$work/gpus.txt")
say "$gpus GPU(s): $(head -1 "$work/gpus.txt")"

# -- install: the CUDA build of the pinned torch (PyPI's Linux wheel), the project, deep_ep if it builds
# A venv that sees the system's packages: a CUDA torch already installed there is used as it is.
has_cuda_torch() { "$venv/bin/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
{
    test -x "$venv/bin/python" || "$python" -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    has_cuda_torch || "$venv/bin/python" -m pip install -q torch==2.13.0
    "$venv/bin/python" -m pip install -q -e '.[dev]'
} >"$work/install.log" 2>&1 || {
    echo "bench/gpu/check.sh: the install failed (log below)" >&2
    tail -20 "$work/install.log" >&2
    exit 3
}
if ! has_cuda_torch; then
    echo "bench/gpu/check.sh: torch in $venv has no CUDA: $("$venv/bin/python" -c 'import torch; print(torch.__version__)')" >&2
    exit 3
fi
deep_ep="not installed: $(timeout 150 "$venv/bin/python" -m pip install -q deep_ep 2>&1 | tail -1 || true)"
if "$venv/bin/python" -c 'import deep_ep' >/dev/null 2>&1; then
    deep_ep="installed"
fi
say "deep_ep: $deep_ep"

# -- the CUDA test subset, within what is left of the budget
left=$((budget - ($(date +%s) - started)))
if ((left < 60)); then
    left=60
fi
say "running tests/test_cuda.py (limit ${left} s)"
set +e
PREFILL_GATE_GPU_FIGURES="$work/figures.jsonl" timeout "$left" "$venv/bin/python" -m pytest -q -rA \
    -p no:cacheprovider tests/test_cuda.py --junitxml "$work/junit.xml" 2>&1 | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
set -e

versions=$("$venv/bin/python" - 2>/dev/null <<'PY' || echo "torch versions unreadable"
import torch
nccl = ".".join(map(str, torch.cuda.nccl.version()))
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}")
PY
)
"$venv/bin/python" bench/gpu/report.py --junit "$work/junit.xml" --figures "$work/figures.jsonl" \
    --gpus "$work/gpus.txt" --deep-ep "$deep_ep" --versions "$versions" --seconds "$(($(date +%s) - started))" \
    --pytest-status "$status" --out "$results"
say "wrote $results (pytest exit status $status)"
if ((status != 0)); then
    exit 1
fi
