#!/usr/bin/env bash
# scripts/gpu-check.sh OUTDIR: trainscale's GPU checks on a bare GPU machine, one command, under 8 minutes on one
# GPU (each further GPU adds 90 s to the budget: the GPU suite's multi-GPU tests).
#
# It uses the machine's own Python (PYTHON, default python3) and its CUDA or ROCm torch (>= 2.4), with
# PYTHONPATH=src plus the caller's: no venv, no pip, no network. Steps (each runs even if an earlier one failed,
# each under its own time limit, cut to what is left of the budget; the summary prints both; the exit code is
# 1 if any failed or ran out of time):
#   gpu-visible       torch sees a GPU; if not, one line and exit 2, before anything is written
#   imports           trainscale and what it and the GPU suite import (wheels from the wheel directory below)
#   gpu-suite         python -m pytest tests/gpu (junit.xml), less what the steps below run themselves
#   selftest          python -m trainscale selftest on this node's GPUs (selftest.json)
#   seed-cnn          the seed CNN, 5 epochs of 60,000 MNIST-shaped samples at batch 16 on 1 GPU, timed against
#                     the 73.5 s of seed 004's table
#   strategy:*        ddp, zero1, fsdp, fsdp-bf16 (bf16 mixed precision), deepspeed, each on 1 rank through a
#                     real process group of its own (NCCL on a GPU; tests/gpu/test_gpu_one_card.py); deepspeed
#                     says "deepspeed is not installed" and is skipped where it is absent
#   checkpoint:async  a background checkpoint save, and the next run resuming from it
#   recorder          the step recorder's device, samples, FLOPs and MFU on a model fed through
#                     torchvision-style transforms (nn.Modules without parameters) in a num_workers=0 loader
#   nccl-hang-notice  tests/gpu's test_nccls_own_flight_recorder* (NCCL's flight recorder holds a collective kept in flight, as the hang notice reads it);
#                     skipped, saying so, where the suite has none
# OUTDIR (new or empty) gets 7 files: summary.txt (device, driver, torch build, each step's status, seconds
# and limit), junit.xml, selftest.json, setup.log, gpu-suite.log (the suite and every pytest step), selftest.log,
# train.log.
#
# trainscale's dependencies that the GPU image lacks come from a wheel directory, TRAINSCALE_WHEELS (default:
# scripts/wheels in this repository: python-hostlist and cloudpickle, pure-Python wheels, which the image with
# python3 3.12, torch, numpy, pytest, pytest-xdist, rich, psutil, matplotlib, transformers and accelerate lacks).
# They were made on a machine with a network (python-hostlist is published as a source archive only, so pip
# builds its wheel; cloudpickle's is downloaded):
#   pip wheel --no-deps -w scripts/wheels python-hostlist==2.3.0
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps \
#       -d scripts/wheels cloudpickle
# For another image add what it lacks the same way (its Python version; compiled ones for its architecture). A
# wheel whose distribution the Python already has is left out. Pure-Python wheels go on PYTHONPATH as they are
# (Python imports from a wheel, a zip); compiled ones (psutil, numpy) are unpacked into a temporary folder.
# Nothing is installed.
#
# TRAINSCALE_GPU_SUITE_ON_CPU=1 is the CPU check mode: no GPU needed, everything runs on CPU and shrunk
# (tests/gpu in its own CPU mode, the CNN for 4 steps, each strategy for 2), with limits four times longer (a
# loaded CI machine), so CI runs this script (tests/unit/test_gpu_check_script.py) and it cannot rot; it says
# nothing about GPUs. TRAINSCALE_GPU_CHECK_PYTEST_ARGS: more pytest arguments, split on
# spaces (tests/unit/test_gpu_check_script.py passes -k with one test). TRAINSCALE_GPU_CHECK_STEPS: a comma-separated
# list of the steps to run (gpu-visible and imports always run), e.g. to run one again.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: scripts/gpu-check.sh OUTDIR (a new or empty directory; see the script's first lines)" >&2
  exit 2
fi
PYTHON=${PYTHON:-python3}
ON_CPU=0
[ "${TRAINSCALE_GPU_SUITE_ON_CPU:-}" = 1 ] && ON_CPU=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case $1 in /*) OUT=$1 ;; *) OUT=$PWD/$1 ;; esac
BUDGET_S=420  # every step's limit is cut to what is left of this: with the kill grace and the summary, < 8 min
SLOW=1  # the steps' limits are multiplied by this (4 in the CPU check mode)
SEED_CNN_S=73.5  # seed 004's table: the CNN, 5 epochs of MNIST at batch 16, on one GPU

if [ -e "$OUT" ] && { [ ! -d "$OUT" ] || [ -n "$(ls -A "$OUT")" ]; }; then
  echo "gpu-check: $OUT exists and is not an empty directory: give a new one (the check writes 7 files there)" >&2
  exit 2
fi
for tool in "$PYTHON" timeout; do
  if ! command -v "$tool" >/dev/null; then
    echo "gpu-check: $tool not found on PATH: set PYTHON=/path/to/python3 (the one with a CUDA or ROCm torch)" >&2
    exit 2
  fi
done
cd "$ROOT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trainscale-gpu-check.XXXXXX")  # run directories, selftest's own report
KEEP_WORK=0  # set when a step failed: its run directories stay for `trainscale report`
trap '[ "$KEEP_WORK" = 1 ] || rm -rf "$WORK"' EXIT

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# record NAME STATUS SECONDS LIMIT NOTE: one row of the summary, and one progress line
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$WORK/steps.tsv"
  printf 'gpu-check: %-18s %-7s %6s s of %4s s  %s\n' "$1" "$2" "$3" "$4" "$5"
}

# wanted NAME: whether TRAINSCALE_GPU_CHECK_STEPS (when set) names the step
wanted() { [ -z "${TRAINSCALE_GPU_CHECK_STEPS:-}" ] || [[ ",$TRAINSCALE_GPU_CHECK_STEPS," == *",$1,"* ]]; }

# run_step NAME LIMIT_S STDOUT STDERR CMD...: CMD under a time limit (SIGINT, as Ctrl-C: pytest still writes
# its junit file, trainscale ends its ranks; SIGKILL 10 s later), its output appended to the two files. A pytest
# step (STDOUT a .pytest file) whose tests were all skipped is a skip, with pytest's reason.
run_step() {
  local name=$1 limit=$(($2 * SLOW)) out=$3 err=$4 left rc t0 secs
  shift 4
  wanted "$name" || return 0
  left=$((BUDGET_S - SECONDS))
  if [ "$left" -lt 10 ]; then
    record "$name" timeout 0 0 "not run: the check's ${BUDGET_S} s were spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  { printf '\n=== %s (limit %s s):' "$name" "$limit"; printf ' %q' "$@"; printf '\n'; } >>"$err"
  t0=$(now)
  if [ "$out" = "$err" ]; then
    if timeout -s INT -k 10 "$limit" "$@" >>"$out" 2>&1 </dev/null; then rc=0; else rc=$?; fi
  else
    if timeout -s INT -k 10 "$limit" "$@" >>"$out" 2>>"$err" </dev/null; then rc=0; else rc=$?; fi
  fi
  secs=$(since "$t0")
  if [ "$rc" = 0 ] && [ "${out%.pytest}" != "$out" ] && grep -q ' skipped' "$out" && ! grep -q ' passed' "$out"; then
    record "$name" skip "$secs" "$limit" "$(sed -n 's/^SKIPPED \[[0-9]*\] [^ ]*: //p' "$out" | head -n 1)"
    return 0
  fi
  case $rc in
    0) record "$name" pass "$secs" "$limit" "" ;;
    124 | 137) record "$name" timeout "$secs" "$limit" "stopped at its ${limit} s limit" ;;
    *) record "$name" fail "$secs" "$limit" "exit code $rc" ;;
  esac
}

# run_test NAME LIMIT_S PYTEST_ARGS...: a step that is tests of tests/gpu, its output appended to gpu-suite.log
run_test() {
  local name=$1 limit=$2 out="$WORK/step.pytest"
  shift 2
  wanted "$name" || return 0
  : >"$out"
  run_step "$name" "$limit" "$out" "$out" "$PYTHON" -m pytest -q -rs -p no:cacheprovider "$@"
  { printf '\n=== %s\n' "$name"; cat "$out"; } >>"$OUT/gpu-suite.log"
}

# --- gpu-visible: before anything is written, so that a machine without a GPU gets one line
t0=$(now)
if ! timeout -k 10 120 "$PYTHON" - "$ON_CPU" >"$WORK/env.txt" 2>"$WORK/probe.err" <<'PY'
import re
import sys
import warnings

on_cpu = sys.argv[1] == "1"
python = f"{sys.executable} (Python {sys.version.split()[0]})"
print(f"python={python}")
if sys.version_info < (3, 10):
    print(f"problem={python} is older than the Python 3.10 trainscale needs: set PYTHON to a newer one")
    sys.exit(0)
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as exc:  # noqa: BLE001 - whatever stops torch, said in one line
    print(f"problem={python} cannot import torch ({type(exc).__name__}: {' '.join(str(exc).split())}): "
          f"set PYTHON to the Python that has the machine's CUDA or ROCm torch")
    sys.exit(0)
version = torch.__version__
build = f"CUDA {torch.version.cuda}" if torch.version.cuda else (
    f"ROCm {torch.version.hip}" if torch.version.hip else "CPU-only")
print(f"torch={version}")
print(f"build={build}")
release = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
if release < (2, 4):
    print(f"problem=torch {version} of {python} is older than the torch 2.4 trainscale needs")
    sys.exit(0)
print(f"gpus={count}")
if count:
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    props = torch.cuda.get_device_properties(0)
    others = sorted(set(names[1:]) - {names[0]})
    print(f"device={count} x {names[0]}" + (f" (and {', '.join(others)})" if others else ""))
    print(f"memory={props.total_memory / 2**30:.1f} GiB, compute capability {props.major}.{props.minor}")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    print(f"cudnn={cudnn}")
    try:
        print(f"nccl={'.'.join(map(str, torch.cuda.nccl.version()))}")
    except Exception:  # noqa: BLE001 - a build without NCCL says so in the summary
        print("nccl=none")
    driver_api = getattr(torch._C, "_cuda_getDriverVersion", None)
    if torch.version.cuda and driver_api:
        api = driver_api()
        print(f"driver_api=CUDA driver API {api // 1000}.{api % 1000 // 10}")
elif not on_cpu:
    if build == "CPU-only":
        why = f"torch {version} is a CPU-only build"
    else:
        said = [" ".join(str(w.message).split()) for w in caught if "cuda" in str(w.message).lower()]
        why = f"torch {version}, {build}: " + (said[0] if said else "torch.cuda.is_available() is False")
    print(f"problem=no GPU visible to {python} ({why}): run it on a GPU machine whose python3 has a CUDA or "
          f"ROCm torch >= 2.4 (or set PYTHON), or set TRAINSCALE_GPU_SUITE_ON_CPU=1 to check the script on CPU")
PY
then
  echo "gpu-check: the GPU probe of $PYTHON failed: $(tail -n 1 "$WORK/probe.err")" >&2
  exit 2
fi
problem=$(sed -n 's/^problem=//p' "$WORK/env.txt")
if [ -n "$problem" ]; then
  echo "gpu-check: $problem" >&2
  exit 2
fi
GPUS=$(sed -n 's/^gpus=//p' "$WORK/env.txt")
EXTRA_GPUS=$(( ${GPUS:-0} > 1 ? GPUS - 1 : 0 ))  # each adds 90 s: the GPU suite's multi-GPU tests
if [ "$ON_CPU" = 1 ]; then
  DEVICE=cpu SLOW=4 BUDGET_S=1200
else
  DEVICE=cuda BUDGET_S=$((BUDGET_S + 90 * EXTRA_GPUS))
fi
mkdir -p "$OUT"
echo "gpu-check: writing to $OUT; every step has a time limit, all together at most ${BUDGET_S} s"
SETUP_LOG=$OUT/setup.log
cat "$WORK/env.txt" "$WORK/probe.err" >"$SETUP_LOG"
if [ "$ON_CPU" = 1 ]; then
  record gpu-visible skip "$(since "$t0")" 120 "CPU check mode (TRAINSCALE_GPU_SUITE_ON_CPU=1): says nothing about GPUs"
else
  record gpu-visible pass "$(since "$t0")" 120 "$(sed -n 's/^device=//p' "$WORK/env.txt")"
fi
DRIVER=$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
case $DRIVER in
  [0-9]*) ;;  # nvidia-smi prints its own failures on stdout
  *) DRIVER=$(timeout 20 rocm-smi --showdriverversion 2>/dev/null | sed -n 's/.*[Dd]river [Vv]ersion[^0-9]*//p' |
    head -n 1 || true) ;;
esac
echo "driver=${DRIVER:-}" >>"$WORK/env.txt"

# --- imports: the wheel directory, then what trainscale and the GPU suite import
t0=$(now)
WHEELS=${TRAINSCALE_WHEELS:-$ROOT/scripts/wheels}
WHEEL_PATH=""
: >"$WORK/wheels.txt"
if [ -d "$WHEELS" ]; then
  WHEEL_PATH=$(timeout -k 5 60 "$PYTHON" - "$WHEELS" "$WORK/site" "$WORK/wheels.txt" <<'PY'
import importlib.metadata as metadata
import sys
import zipfile
from pathlib import Path

wheels, site, notes = Path(sys.argv[1]), Path(sys.argv[2]), []
entries = []
for wheel in sorted(wheels.glob("*.whl")):
    dist = wheel.name.split("-")[0]
    try:
        notes.append(f"{wheel.name}: left out, {dist} {metadata.version(dist)} is installed")
        continue
    except metadata.PackageNotFoundError:
        pass
    if wheel.name.endswith("-none-any.whl"):  # pure Python: importable from the zip itself
        entries.append(str(wheel))
        notes.append(f"{wheel.name}: on PYTHONPATH")
    else:  # compiled code cannot load from a zip
        with zipfile.ZipFile(wheel) as whl:
            whl.extractall(site)
        notes.append(f"{wheel.name}: unpacked into a temporary folder on PYTHONPATH")
if site.exists():
    entries.append(str(site))
Path(sys.argv[3]).write_text("".join(f"{note}\n" for note in notes))
print(":".join(entries))
PY
  ) || echo "wheels from $WHEELS could not be used (see setup.log)" >>"$WORK/wheels.txt"
elif [ -n "${TRAINSCALE_WHEELS:-}" ]; then
  echo "TRAINSCALE_WHEELS=$TRAINSCALE_WHEELS is not a directory: no wheels used" >>"$WORK/wheels.txt"
fi
export PYTHONPATH="$ROOT/src${WHEEL_PATH:+:$WHEEL_PATH}${PYTHONPATH:+:$PYTHONPATH}"
{ echo "PYTHONPATH=$PYTHONPATH"; cat "$WORK/wheels.txt"; } >>"$SETUP_LOG"
if timeout -k 5 60 "$PYTHON" - "$WORK/no-deepspeed" >>"$SETUP_LOG" 2>&1 <<'PY'
import importlib
import importlib.util
import sys

needed = {"trainscale": "this repository's src/", "hostlist": "python-hostlist", "rich": "rich",
          "markdown_it": "markdown-it-py", "mdurl": "mdurl", "pygments": "pygments", "psutil": "psutil",
          "cloudpickle": "cloudpickle", "numpy": "numpy", "pytest": "pytest", "xdist": "pytest-xdist",
          "execnet": "execnet"}
if sys.version_info < (3, 11):
    needed["tomli"] = "tomli"
missing = []
for module, dist in needed.items():
    try:
        found = importlib.import_module(module)
        print(f"import {module}: {getattr(found, '__version__', '')} {getattr(found, '__file__', '')}")
    except Exception as exc:  # noqa: BLE001 - each missing one named
        print(f"import {module}: FAILED ({type(exc).__name__}: {exc})")
        missing.append(dist)
with open(sys.argv[1], "w") as fh:  # the deepspeed step's skip, said rather than timed out
    fh.write("" if importlib.util.find_spec("deepspeed") else "deepspeed is not installed")
if missing:
    print(f"missing: {', '.join(missing)}: pip wheel --no-deps -w DIR {' '.join(missing)} on a networked "
          f"machine with this Python version, then TRAINSCALE_WHEELS=DIR (the script's first lines)")
    sys.exit(1)
PY
then
  used=$(grep -c ': on PYTHONPATH\|: unpacked' "$WORK/wheels.txt" || true)
  record imports pass "$(since "$t0")" 60 "$used wheel(s) used"
else
  record imports fail "$(since "$t0")" 60 "$(sed -n 's/^missing: \([^:]*\):.*/missing \1/p' "$SETUP_LOG" | tail -n 1)$(
    sed -n 's/^\(TRAINSCALE_WHEELS=.*\): no wheels used/ (\1)/p' "$WORK/wheels.txt")"
fi

# --- gpu-suite: tests/gpu (in its own CPU mode when TRAINSCALE_GPU_SUITE_ON_CPU=1, which it reads itself), less the
# tests the steps below run one by one (selftest's is the selftest step); 150 s and 90 s for each further GPU
read -r -a PYTEST_EXTRA <<<"${TRAINSCALE_GPU_CHECK_PYTEST_ARGS:-}"
run_step gpu-suite $((150 + 90 * EXTRA_GPUS)) "$OUT/gpu-suite.log" "$OUT/gpu-suite.log" \
  "$PYTHON" -m pytest tests/gpu -v -rs -p no:cacheprovider --junitxml "$OUT/junit.xml" \
  --ignore tests/gpu/test_gpu_one_card.py \
  -k "not test_selftest_passes_on_this_nodes_gpus and not test_nccls_own_flight_recorder" \
  "${PYTEST_EXTRA[@]}"

# --- selftest: one rank per visible GPU (one CPU rank in the CPU check mode, as on a 1-GPU machine)
SELFTEST=("$PYTHON" -m trainscale selftest --device "$DEVICE" --json --out "$WORK/selftest")
[ "$ON_CPU" = 1 ] && SELFTEST+=(--nproc 1)
run_step selftest 90 "$OUT/selftest.json" "$OUT/selftest.log" "${SELFTEST[@]}"

# --- seed-cnn: seed 004's CNN and settings (cnn.py), on MNIST-shaped data of MNIST's size (no download)
TRAIN=("$PYTHON" -m trainscale run --nproc-per-node 1 --log-dir "$WORK/runs" --workload cnn --device "$DEVICE"
  --data synthetic --batch-size 16 --lr 0.001)
if [ "$ON_CPU" = 1 ]; then CNN=(--epochs 1 --max-steps 4 --samples 256); else CNN=(--epochs 5 --samples 60000); fi
run_step seed-cnn 120 "$OUT/train.log" "$OUT/train.log" "${TRAIN[@]}" "${CNN[@]}" --metrics-out "$WORK/seed-cnn.json"

# --- strategy:NAME, each on 1 rank through a real group (deepspeed's first start compiles its ops: a longer limit)
ONE_CARD=tests/gpu/test_gpu_one_card.py
for name in ddp zero1 fsdp fsdp-bf16 deepspeed; do
  if [ "$name" = deepspeed ] && [ -s "$WORK/no-deepspeed" ]; then
    ! wanted "strategy:$name" || record "strategy:$name" skip 0 0 "$(cat "$WORK/no-deepspeed")"
    continue
  fi
  limit=30
  [ "$name" = deepspeed ] && limit=90
  run_test "strategy:$name" "$limit" "$ONE_CARD::test_one_rank_trains_through_a_real_process_group[$name]"
done

# --- checkpoint:async, recorder: a background save and its resume; the recorder with transforms
run_test checkpoint:async 45 "$ONE_CARD::test_a_background_checkpoint_save_resumes"
run_test recorder 30 "$ONE_CARD::test_the_recorder_times_the_gpu_and_rates_the_model_not_its_transforms"

# --- nccl-hang-notice: the flight recorder's test, where the suite has it
if grep -qs 'def test_nccls_own_flight_recorder' tests/gpu/*.py; then
  run_test nccl-hang-notice 60 tests/gpu -k test_nccls_own_flight_recorder
else
  ! wanted nccl-hang-notice || record nccl-hang-notice skip 0 0 \
    "tests/gpu has no test_nccls_own_flight_recorder* (the flight recorder's hang notice)"
fi

# --- summary.txt
if awk -F '\t' '$2 == "fail" || $2 == "timeout" { failed = 1 } END { exit !failed }' "$WORK/steps.tsv"; then
  KEEP_WORK=1
fi
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$COMMIT" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ]; then
  COMMIT="$COMMIT with local changes"
fi
timeout -k 5 15 "$PYTHON" - "$WORK" "$OUT" "$ON_CPU" "$SEED_CNN_S" "$COMMIT" "$BUDGET_S" "$KEEP_WORK" <<'PY'
import json
import socket
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

work, out, on_cpu, seed_s, commit, budget, kept = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", \
    float(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7] == "1"
env = dict(line.split("=", 1) for line in (work / "env.txt").read_text().splitlines() if "=" in line)
rows = [line.split("\t") for line in (work / "steps.tsv").read_text().splitlines()]


def suite_note() -> str:
    try:
        suite = ET.parse(out / "junit.xml").getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
        return f"{passed} passed, {n['failures'] + n['errors']} failed, {n['skipped']} skipped (junit.xml)"
    except (OSError, ET.ParseError, AttributeError):
        return "no junit.xml (gpu-suite.log)"


def selftest_note() -> str:
    try:
        report = json.loads((out / "selftest.json").read_text())
    except (OSError, ValueError):
        return "no report (selftest.log)"
    return ", ".join(f"{c['name']} {c['status']}" for c in report["checks"])


def cnn_note() -> str:
    try:
        metrics = json.loads((work / "seed-cnn.json").read_text())
    except (OSError, ValueError):
        return f"no time (train.log); seed 004's table: {seed_s} s on 1 GPU"
    train_s, steps = metrics["train_time_s"], metrics["steps"]
    accuracy = metrics["epochs"][-1].get("accuracy")
    said = f"training {train_s:.1f} s for {steps} steps" + (f", held-out accuracy {accuracy:.1%}" if accuracy else "")
    if on_cpu:
        return f"{said}; CPU check mode, not comparable with the {seed_s} s of seed 004's table (1 GPU)"
    return f"{said}; seed 004's table: {seed_s} s on 1 GPU (this run {train_s / seed_s:.2f}x that time)"


notes = {"gpu-suite": suite_note, "selftest": selftest_note, "seed-cnn": cnn_note}
failed = [name for name, status, *_ in rows if status in ("fail", "timeout")]
lines = [
    f"trainscale GPU check (scripts/gpu-check.sh), {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
    f"host {socket.gethostname()}",
    "mode:       " + ("CPU check mode (TRAINSCALE_GPU_SUITE_ON_CPU=1): checks the script, says nothing about GPUs"
                      if on_cpu else "GPU"),
    f"device:     {env.get('device', 'none (CPU)')}" + (f", {env['memory']}" if env.get("memory") else ""),
    f"driver:     {env.get('driver') or 'unknown'}" + (f" ({env['driver_api']})" if env.get("driver_api") else ""),
    f"torch:      {env.get('torch')} ("
    + ", ".join([env.get("build", "?")] + [f"{lib} {env[key]}" for key, lib in (("cudnn", "cuDNN"), ("nccl", "NCCL"))
                                           if env.get(key, "None") not in ("None", "none")]) + ")",
    f"python:     {env.get('python')}",
    f"trainscale: commit {commit}",
    "",
    f"{'step':<18} {'status':<7} {'seconds':>8} {'limit':>6}  note",
]
for name, status, seconds, limit, note in rows:
    extra = notes[name]() if name in notes else ""
    lines.append(f"{name:<18} {status:<7} {float(seconds):>8.1f} {limit:>6}  {'; '.join(filter(None, (note, extra)))}")
lines += ["", f"result: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}; "
          f"{len(rows)} steps within the {budget} s budget; logs: setup.log, gpu-suite.log, selftest.log, train.log"]
if kept:
    lines.append(f"the run directories the logs name are kept in {work} (trainscale report DIR); delete it after")
(out / "summary.txt").write_text("\n".join(lines) + "\n")
PY
echo
cat "$OUT/summary.txt"
[ "$KEEP_WORK" = 0 ] || exit 1
