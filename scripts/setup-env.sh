#!/usr/bin/env bash
# Create .venv (if needed) and install trainscale with the extras EXTRAS names: `bench` (matplotlib) for
# `make demo`, `test` (everything the suite exercises) for `make test`. Each step says what it does and how long
# it took: a first install takes minutes, and silence reads as a hang.
# Torch: the CPU build is pinned where a local wheel store has it (no multi-GB CUDA download);
# elsewhere set TORCH_SPEC yourself, e.g. TORCH_SPEC='torch>=2.4' on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test}
STAMP="$VENV/.trainscale-installed-$EXTRAS"  # one per set of extras: the demo's is not the tests'
say() { echo "setup-env: $*" >&2; }

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
say "installing into $VENV: $TORCH_SPEC, then trainscale[$EXTRAS] (a first install takes a few minutes)"
BEGIN=$SECONDS
# Bytecode is compiled on every core rather than by pip, file by file on one: torch's while pip installs the
# rest, then the rest. (Every rank and launcher imports these; some run with -B and would never write it.)
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$VENV/bin/pip" install -q --disable-pip-version-check --no-compile "$TORCH_SPEC"
say "torch installed ($((SECONDS - BEGIN)) s); now trainscale[$EXTRAS] and its dependencies"
"$VENV/bin/python" -m compileall -q "$SITE/torch" >/dev/null 2>&1 &
COMPILING=$!
# The constraint keeps torch where it is while the extras are resolved.
CONSTRAINT=$(mktemp)
"$VENV/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > "$CONSTRAINT"
PIP_CONSTRAINT="$CONSTRAINT" "$VENV/bin/pip" install -q --disable-pip-version-check --no-compile -e ".[$EXTRAS]"
rm -f "$CONSTRAINT"
wait "$COMPILING" || true  # a file for another Python version does not compile; pip skips those too
"$VENV/bin/python" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
say "done in $((SECONDS - BEGIN)) s: $("$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | tail -n +3 | wc -l) packages in $VENV"
touch "$STAMP"
