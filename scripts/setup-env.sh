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
# Bytecode is compiled on every core rather than by pip, file by file on one: torch's while pip installs the
# rest, then the rest. (Every rank and launcher imports these; some run with -B and would never write it.)
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$VENV/bin/pip" install -q --disable-pip-version-check --no-compile "$TORCH_SPEC"
"$VENV/bin/python" -m compileall -q "$SITE/torch" >/dev/null 2>&1 &
COMPILING=$!
# The constraint keeps torch where it is while the extras are resolved.
CONSTRAINT=$(mktemp)
"$VENV/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > "$CONSTRAINT"
PIP_CONSTRAINT="$CONSTRAINT" "$VENV/bin/pip" install -q --disable-pip-version-check --no-compile -e ".[$EXTRAS]"
rm -f "$CONSTRAINT"
wait "$COMPILING" || true  # a file for another Python version does not compile; pip skips those too
"$VENV/bin/python" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
touch "$STAMP"
