#!/usr/bin/env bash
# Create .venv (if needed) and install trainscale with what the demo and the tests need.
# Torch: the CPU build is pinned where a local wheel store has it (no multi-GB CUDA download);
# elsewhere set TORCH_SPEC yourself, e.g. TORCH_SPEC='torch>=2.4' on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
STAMP="$VENV/.trainscale-installed"
EXTRAS=${EXTRAS:-test}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Re-install only when the project's dependency list changed since the last install.
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ -z "${FORCE_INSTALL:-}" ]; then
  exit 0
fi
if [ -z "${TORCH_SPEC:-}" ]; then
  if "$VENV/bin/pip" download --no-deps --no-index -q -d "$(mktemp -d)" 'torch==2.13.0+cpu' >/dev/null 2>&1; then
    TORCH_SPEC='torch==2.13.0+cpu'
  else
    TORCH_SPEC='torch>=2.4'
  fi
fi
echo "setup-env: installing $TORCH_SPEC and trainscale[$EXTRAS] into $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "$TORCH_SPEC"
# The constraint keeps torch where it is while the extras are resolved.
CONSTRAINT=$(mktemp)
"$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__)' > "$CONSTRAINT"
PIP_CONSTRAINT="$CONSTRAINT" "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[$EXTRAS]"
rm -f "$CONSTRAINT"
touch "$STAMP"
