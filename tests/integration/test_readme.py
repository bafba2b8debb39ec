"""README is a test: every command of its ```bash blocks, then of docs/tour.md's (the tour of every command
README points to), runs in order in one fresh directory, as a newcomer pastes them into one shell (the
README's script saved as train.py first, as README says).

Cluster lines run on the two-node SLURM test cluster (README's `--profile local-test`); lines for a real
site (`--profile lumi`) are dry runs in README itself. The few commands that cannot run here are listed in
SKIPPED or REPLACED below with the reason; a README command that fails, or a new one this test cannot
place, fails the test with the command and its output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.browser import check_page, chromium, screenshot  # noqa: F401  (chromium: a fixture)

from trainscale.selftest.run import HANG_MARGIN_S

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOUR = ROOT / "docs" / "tour.md"
SELFTEST_CHECKS = ["devices", "all-reduce", "equivalence", "strategies", "resume", "breakdown", "binding", "hang"]
MARK = "## README $ "
"""Printed before each command on both streams (then each command's output can be found)."""
CLOCK = "## README @ "

SKIPPED = {
    "make test": "the whole suite, which runs this test",
    "source .venv/bin/activate": "this test's environment has trainscale on PATH already",
    "pip install -e '.[trackers]'": "no network in tests; the test extra installs the trackers",
    "singularity exec lumi-pytorch.sif bash -c '$WITH_CONDA && python3 -m venv --system-site-packages venv-ts && "
    "venv-ts/bin/pip install -e PATH_TO_CLONE'": "LUMI's image and singularity: the dry run after it is the test",
}
REPLACED = {
    # `make demo` makes .venv first; here it exists (the suite runs in it), so the recipe's own command runs
    "make demo": lambda: demo_recipe(),
}


def demo_recipe() -> str:
    line = next(ln for ln in (ROOT / "Makefile").read_text().splitlines() if "-m trainscale bench" in ln)
    return line.strip().replace("$(PY)", shlex.quote(sys.executable)).replace("$$", "$")


def commands(text: str) -> list[str]:
    """The commands of README's bash blocks in order: continuation lines joined, a heredoc kept whole with
    its command, comment lines dropped."""
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            command = line
            while command.endswith("\\") and i < len(lines):
                command = command[:-1] + " " + lines[i].strip()
                i += 1
            heredoc = re.search(r"<<\s*'?(\w+)'?", command)
            if heredoc:
                body = []
                while i < len(lines) and lines[i] != heredoc.group(1):
                    body.append(lines[i])
                    i += 1
                i += 1
                command = "\n".join([command, *body, heredoc.group(1)])
            out.append(command)
    return out


def key(command: str) -> str:
    """The command without its trailing comment."""
    return re.sub(r"\s+#.*$", "", command.splitlines()[0]).strip()


def script(text: str) -> str:
    """The bash script a newcomer's pasting amounts to: each command echoed, then run; the first failure stops it."""
    parts = ["set -eo pipefail"]
    for command in commands(text):
        k = key(command)
        if k in SKIPPED:
            parts.append(f"echo {shlex.quote(f'{MARK}{k}: skipped ({SKIPPED[k]})')}")
            continue
        run = REPLACED[k]() if k in REPLACED else command
        mark = shlex.quote(MARK + k)
        # on both streams, so that each command's output can be found, and when it started
        parts += [f'echo {mark}; echo {mark} >&2; echo "{CLOCK}$(date +%s.%N)" >&2', run]
    return "\n".join(parts) + "\n"


def readme_train_script(text: str) -> str:
    section = text[text.index("## Your script, unchanged") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def pasted() -> str:
    """README, then the tour: what a reader pastes, in order."""
    return README.read_text() + "\n" + TOUR.read_text()


def test_every_readme_command_is_placed():
    """A command SKIPPED or REPLACED names must still be in README or the tour (else the table is stale)."""
    keys = {key(c) for c in commands(pasted())}
    assert set(SKIPPED) | set(REPLACED) <= keys, (set(SKIPPED) | set(REPLACED)) - keys
    assert len(keys) >= 40  # the command lines, not a handful


def test_readme_is_short():
    """A newcomer reads README in five minutes: at most 200 lines, the rest in docs/ (issue 38)."""
    assert len(README.read_text().splitlines()) <= 200


@dataclass
class Readme:
    """README's commands, run once in one fresh directory; the tests below read what they left."""

    dir: Path
    done: subprocess.CompletedProcess
    env: dict[str, str]

    def command(self, start: str) -> str:
        """The one README command that starts with ``start``."""
        ran = [line[len(MARK) :] for line in self.done.stderr.splitlines() if line.startswith(MARK)]
        found = [k for k in ran if k.startswith(start)]
        assert len(found) == 1, f"README runs {len(found)} command(s) starting with {start!r}: {found}"
        return found[0]

    def output(self, start: str, stream: str = "stdout") -> str:
        """What the README command starting with ``start`` printed on ``stream``."""
        lines = getattr(self.done, stream).splitlines()
        begin = lines.index(MARK + self.command(start)) + 1
        end = next((i for i in range(begin, len(lines)) if lines[i].startswith(MARK)), len(lines))
        return "\n".join(lines[begin:end]) + "\n"

    def seconds(self, start: str) -> float:
        """How long the README command starting with ``start`` took (to the start of the next one)."""
        lines = self.done.stderr.splitlines()
        ran = [line[len(MARK) :] for line in lines if line.startswith(MARK)]
        starts = [float(line[len(CLOCK) :]) for line in lines if line.startswith(CLOCK)]
        index = ran.index(self.command(start))
        return starts[index + 1] - starts[index]


@pytest.fixture(scope="module")
def readme(slurm_cluster, tmp_path_factory) -> Readme:
    text = pasted()
    tmp_path = tmp_path_factory.mktemp("readme")
    (tmp_path / "train.py").write_text(readme_train_script(README.read_text()))
    (tmp_path / "readme.sh").write_text(script(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINSCALE_", "RANK", "WORLD_SIZE"))}
    env.update(
        slurm_cluster.env,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        TRAINSCALE_STATE_DIR=str(tmp_path / "state"),
        WANDB_MODE="offline",
    )
    done = subprocess.run(["bash", "readme.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    ran = [line[len(MARK) :] for line in done.stderr.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0, (
        f"README command failed: {ran[-1] if ran else '?'}\n--- stdout (tail)\n"
        f"{done.stdout[-4000:]}\n--- stderr (tail)\n{done.stderr[-6000:]}"
    )
    assert len(ran) == sum(key(c) not in SKIPPED for c in commands(text))
    return Readme(tmp_path, done, env)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_readme_commands_run_in_order_in_one_fresh_directory(readme, chromium, capsys):
    tmp_path, done, env = readme.dir, readme.done, readme.env
    # what the README promises the commands leave behind, for the next command a reader types
    # make demo's study with the page `trainscale report bench-out/latest` drew right after it (a later
    # study, the SLURM one, has become bench-out/latest since, and README reads it as text only)
    (demo,) = [p for p in (tmp_path / "bench-out").glob("demo-*") if not p.is_symlink()]
    assert (demo / "report" / "report.html").is_file(), demo
    assert ((tmp_path / "bench-out" / "latest") / "results.json").is_file()
    assert (tmp_path / "trainscale-runs" / "latest" / "run.json").is_file()
    assert (tmp_path / "tuned.toml").is_file() and (tmp_path / "study1" / "results.json").is_file()

    # make demo then `trainscale report` on its study, as the demo's last line says
    assert f"next: trainscale report bench-out/{demo.name}   (the page" in done.stdout
    for name in ("01-1", "02-2"):  # one directory per configuration: its records, logs, what ran
        run = demo / "runs" / name
        assert (run / "metrics" / "rank-0.jsonl").is_file() and (run / "run.json").is_file()
        assert (run / "attempt_0" / "0" / "stdout.log").is_file() and (run / "metrics.json").is_file()
    report = subprocess.run(
        [sys.executable, "-m", "trainscale", "report", demo],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert (
        "what ran   scaling study of workload cnn: a fixed problem: 2 epoch(s) at each size, per-rank batch 16 "
        "(the global batch grows with the ranks)" in text
    )
    assert re.search(r"versions\s+trainscale \S+, torch \S+, python \S+", text) and "host       " in text
    assert re.search(r"^\[(problem|note|good)\] DDP 2 CPU ranks: ", text, re.M), text  # the study's verdict
    assert re.search(r"^Single CPU rank\s+1\s", text, re.M) and re.search(r"^DDP 2 CPU ranks\s+2\s", text, re.M)
    for section in ("== Single CPU rank (01-1) ==", "== DDP 2 CPU ranks (02-2) =="):  # each one's own verdict
        part = text.split(section)[1].split("\n== ")[0]
        assert re.search(r"^\[(problem|note|good)\] ", part, re.M) and re.search(r"^rank\s+host\s+steps", part, re.M)
    assert "(no plots" not in text and "matplotlib is not installed" not in text
    for png in ("speedup.png", "throughput.png", "breakdown.png"):
        assert "plot: " in text and png in text
    page = demo / "report" / "report.html"
    assert check_page(chromium, page, tmp_path / "chrome") >= 3  # the study's speedup, throughput, breakdown
    screenshot(
        chromium,
        page,
        tmp_path / "chrome",
        demo / "report" / "screenshot.png",
        capsys,
        "`make demo`'s study report",
        height=4200,
    )


def _selftest(readme: Readme, nodes: int) -> tuple[Path, dict, dict]:
    """README's selftest on ``nodes`` node(s) (both write under selftest-out/): its directory, report and rows."""
    found = [(p.parent, json.loads(p.read_text())) for p in (readme.dir / "selftest-out").glob("*/selftest.json")]
    ((directory, report),) = [(d, r) for d, r in found if r["meta"]["num_nodes"] == nodes]
    return directory, report, {c["name"]: c for c in report["checks"]}


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test to run sets README's run up
def test_readme_selftest_passes_every_cpu_check_and_writes_the_ticket_files(readme):
    """`trainscale selftest --skip deepspeed`: the gloo subset, end to end, through the training launcher."""
    directory, report, rows = _selftest(readme, 1)
    # breakdown compares two timings (the step's communication vs the bus bandwidth measured before it): on
    # cores shared with other work they may disagree, and it warns; every other check must pass
    assert list(rows) == SELFTEST_CHECKS and all(c["status"] == "pass" for n, c in rows.items() if n != "breakdown"), (
        rows
    )
    assert rows["breakdown"]["status"] in ("pass", "warn"), rows["breakdown"]
    assert report["meta"]["world_size"] == 2 and report["meta"]["backend"] == "gloo"
    # the figures a ticket needs: bandwidth, equivalence, time to the named error
    assert rows["all-reduce"]["detail"]["plateau"]["busbw_Bps"] > 0
    assert rows["equivalence"]["detail"]["max_rel"] <= 1e-6
    assert rows["resume"]["detail"]["bitwise"] is True
    assert rows["breakdown"]["detail"]["communication"] > 0  # the exposed all-reduce, from the step records
    hang = rows["hang"]["detail"]  # README keeps the default --hang-timeout 10
    assert "rank(s) 1 did not arrive" in hang["message"] and 10.0 <= hang["seconds"] <= 10.0 + HANG_MARGIN_S
    assert hang["stack"] and "in stop_participating" in hang["message"]  # the hung rank's stack, from its heartbeat
    printed = readme.output("trainscale selftest --skip deepspeed")
    assert "strategies   PASS   zero1 = ddp bitwise, fsdp" in printed and "deepspeed skipped" in printed
    assert re.search(r"Summary: [78] passed, 0 failed", printed), printed
    assert (directory / "selftest.txt").read_text() in printed
    assert (directory / "logs" / "checks").is_dir() and (directory / "logs" / "hang").is_dir()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test to run sets README's run up
def test_readme_selftest_on_slurm_runs_two_jobs_and_reports_every_check(readme):
    """`trainscale selftest --slurm`: both launches are real batch jobs made by `trainscale slurm`'s plan, lint
    and submission; the hang job fails as it must, naming the stopped rank."""
    _, report, rows = _selftest(readme, 2)
    assert report["meta"]["world_size"] == 4
    assert all(c["status"] in ("pass", "warn") for c in rows.values()), rows  # binding depends on the profile
    assert "rank(s) 3 did not arrive" in rows["hang"]["detail"]["message"]
    assert "in stop_participating" in rows["hang"]["detail"]["message"]  # its stack, through the store of a 2-node job
    assert readme.output("trainscale selftest --slurm", "stderr").count("submitted job") == 2


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test to run sets README's run up
def test_readme_tune_searches_within_its_budget_and_run_takes_the_result(readme):
    """`trainscale plan --tune --budget 20` then `trainscale run --config tuned.toml`: the defaults first, the search
    within its budget, and the run trains with the best per-rank batch it wrote."""
    budget = float(re.search(r"--budget (\d+)", readme.command("trainscale plan --tune --workload cnn")).group(1))
    printed = readme.output("trainscale plan --tune --workload cnn")
    trials = re.findall(r"^\s+\d+\. (batch \d+[^\n]*?)\s{2,}(\d+) samples/s", printed, re.M)
    assert trials and trials[0][0] == "batch 16", printed  # the defaults first
    assert re.search(r"^best: ", printed, re.M), printed
    # the search stops when the next trial and the final pair would not fit: at most one trial over
    slowest = max(float(s) for s in re.findall(r"\((\d+)s\)", printed))
    if len(trials) == 1:  # a busy machine: the first trial's pace left no room for one more and the final pair
        assert 4 * (slowest + 1) > budget, printed  # (seconds printed rounded down)
    assert readme.seconds("trainscale plan --tune --workload cnn") <= budget + 3 * slowest + 30, printed
    table = tomllib.loads((readme.dir / "tuned.toml").read_text())["train"]
    assert f"2 rank(s) x batch {table['batch_size']}," in readme.output(
        "trainscale run --nproc-per-node 2 --workload cnn --epochs 1 --config tuned.toml"
    )
    (run,) = [
        p.parent
        for p in (readme.dir / "trainscale-runs").glob("*/run.json")
        if not p.parent.is_symlink() and "tuned.toml" in json.loads(p.read_text())["command"]
    ]
    with open(run / "metrics" / "rank-0.jsonl") as fh:
        meta = json.loads(fh.readline())  # what the ranks trained with
    assert meta["batch_size"] == table["batch_size"]
    assert meta["strategy"] == table.get("strategy", "ddp").split(":")[0]


def _trainscale(readme: Readme, *argv: str) -> subprocess.CompletedProcess[str]:
    """The next command a reader types, in README's directory and environment."""
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *argv],
        cwd=readme.dir,
        env=readme.env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test to run sets README's run up
def test_readme_study_on_slurm_runs_each_configuration_as_a_job_and_reports_it(readme, slurm_cluster):
    """`trainscale bench --slurm --configs 1 --nodes 2`: each configuration a real batch job, the study's numbers
    what the jobs measured; `trainscale jobs` and `trainscale report` then read the jobs."""
    (study,) = [
        p.parent
        for p in (readme.dir / "bench-out").glob("*/results.json")
        if not p.parent.is_symlink() and [r["config"] for r in json.loads(p.read_text())["runs"]] == ["1", "2n"]
    ]  # not bench-out/latest
    runs = json.loads((study / "results.json").read_text())["runs"]
    # nodes and world size as the ranks reported them from inside the jobs, not as planned
    assert [(r["config"], r["status"], r["nodes"], r["world_size"]) for r in runs] == [
        ("1", "ok", 1, 1),
        ("2n", "ok", 2, 4),
    ]
    for r in runs:
        assert r["epochs"] and r["samples_per_s"] > 0 and r["slurm_job"]
        assert slurm_cluster.job_state(r["slurm_job"]) == "COMPLETED"
        assert Path(r["log_dir"]).is_dir()
    # a speedup above what the shared machine allows (other jobs on its cores) is kept, but not as a result
    speedup = runs[1]["speedup"] or (runs[1]["rejected"] or {}).get("speedup")
    printed = readme.output("trainscale bench --workload cnn --slurm")
    assert speedup > 0 and "| DDP 2 nodes x 2 CPU ranks | 4 |" in printed, printed
    logs = _trainscale(readme, "jobs", runs[1]["slurm_job"], "--rank", "0")
    assert logs.returncode == 0 and "Epoch 1:" in logs.stdout, logs.stderr
    # the study's report finds each job's records in its run directory; a job id gives that run's page
    report = _trainscale(readme, "report", str(study), "--text")
    assert report.returncode == 0, report.stderr
    two_nodes = report.stdout.split("== DDP 2 nodes x 2 CPU ranks (02-2n) ==")[1]
    assert [line.split()[0] for line in two_nodes.splitlines() if re.match(r"^\d\s", line)] == ["0", "1", "2", "3"]
    job = _trainscale(readme, "report", runs[1]["slurm_job"], "--text")
    assert job.returncode == 0, job.stderr
    assert f"SLURM      job {runs[1]['slurm_job']}, profile local-test" in job.stdout
    assert "ranks      4 rank(s) on 2 node(s), torchrun launch mode" in job.stdout
    assert "== SLURM accounting ==" in job.stdout


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test to run sets README's run up
def test_readme_allreduce_on_slurm_is_one_two_node_job(readme):
    (result,) = [
        r
        for r in (json.loads(p.read_text()) for p in (readme.dir / "bench-out" / "allreduce").glob("*/allreduce.json"))
        if r["num_nodes"] == 2
    ]
    assert result["world_size"] == 4
    assert [row["bytes"] for row in result["rows"]][:3] == [1024, 2048, 4096] and result["rows"][-1]["bytes"] == 4 << 20
    assert all(row["busbw_Bps"] == row["algbw_Bps"] * 1.5 > 0 for row in result["rows"])
    assert "submitted job" in readme.output("trainscale bench allreduce --slurm", "stderr")
    assert "busbw" in readme.output("trainscale bench allreduce --slurm")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test to run sets README's run up
def test_readme_workload_job_trains_on_two_nodes_of_two_ranks(readme):
    """`trainscale slurm ... --submit --watch --workload cnn` (torchrun mode; srun mode is in
    tests/slurm/test_preemption.py): the job completed, and rank 0's log, read with `trainscale jobs`, shows
    the workload saw 4 ranks and trained."""
    printed = readme.output("trainscale slurm --profile local-test -N 2 --gpus-per-node 2 -t 00:10:00 --submit")
    job = re.search(r"^Job (\d+) \(trainscale-cnn\) COMPLETED", printed, re.M)
    assert job, printed
    said = readme.output("trainscale slurm --profile local-test -N 2 --gpus-per-node 2 -t 00:10:00 --submit", "stderr")
    assert f"trainscale slurm: next: trainscale report {job.group(1)}" in said, said  # --watch ends with the next step
    log0 = _trainscale(readme, "jobs", job.group(1), "--rank", "0")
    assert log0.returncode == 0, log0.stderr
    assert "4 rank(s) x batch 16" in log0.stdout and re.search(r"Epoch 1: loss [\d.]+", log0.stdout), log0.stdout


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test to run sets README's run up
def test_readme_plan_answers_in_a_minute_and_its_verify_measures_what_it_predicted(readme):
    """README's plan for 4 LUMI nodes (calibrated here) fits and names the line that submits it; `--verify` runs
    2 ranks of train.py here and the held bytes it predicted are what the ranks held (issue 37)."""
    line = "trainscale plan --nproc-per-node 8 --nodes 4 --profile lumi train.py"
    lumi = readme.output(line)
    assert "Recommended: --strategy ddp (it fits" in lumi and "Submit: trainscale slurm --profile lumi -N 4" in lumi
    assert readme.seconds(line) < 60, readme.seconds(line)
    checked = readme.output("trainscale plan --nproc-per-node 2 --verify train.py")
    row = re.search(r"^2 x your script \(ddp\)\s.*$", checked, re.M)
    assert row, checked
    assert re.findall(r"[+-]\d+\.\d%", row.group(0))[1] == "+0.0%", row.group(0)  # held: predicted = measured
