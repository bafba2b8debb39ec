"""A submitted job sees the code, the arguments, the Python and the modules as the user meant them.

The snapshot's rules (root, git and plain listings, what is linked or left out, limits, hash), the
sys.path forms read from a script and the lint naming what the job will not see; job-time variables
in script arguments run through real bash; module lines per profile and per job, the Python they
bring and the probe through them; SLURM's own step failures and an unreachable scheduler named as such.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainscale.errors import ConfigError
from trainscale.launch.slurm import SlurmJobSpec, lint, render, resolve
from trainscale.launch.slurm import snapshot as snap
from trainscale.launch.slurm.imports import imported, path_additions
from trainscale.launch.slurm.jobargs import check_lines, job_words
from trainscale.launch.slurm.lint import ERROR, NOTE, WARNING
from trainscale.launch.slurm.toolchain import job_python, module_lines
from trainscale.profiles.loader import builtin_profile_dir, profile_from_dict, profile_from_file

COURSE_SCRIPT = """\
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), ".."))
from mypkg.model import Net  # noqa: E402
try:
    import mypkg_extras  # optional: the script copes without it
except ImportError:
    mypkg_extras = None
print(Net)
"""


def builtin(name: str):
    return profile_from_file(builtin_profile_dir() / f"{name}.toml")


def course(root: Path, *, marker: str | None = None) -> Path:
    """A course layout: scripts/train.py reaches the sibling package mypkg/ through sys.path."""
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "model.py").write_text("class Net:\n    pass\n")
    (root / "mypkg_extras.py").write_text("")
    (root / "scripts").mkdir()
    (root / "scripts" / "train.py").write_text(COURSE_SCRIPT)
    if marker:
        (root / marker).write_text("")
    return root / "scripts" / "train.py"


# ------------------------------------------------------------------------------------------------ the snapshot's root
def test_the_root_is_the_project_widened_to_what_the_script_reaches(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    script = course(tmp_path / "home" / "course")
    reached = [d for d, _ in path_additions(ast.parse(script.read_text()), str(script))]
    assert reached == [str(tmp_path / "home" / "course")]
    assert snap.code_root(str(script)) == script.parent  # no marker, nothing reached: the script's directory
    assert snap.code_root(str(script), reached) == tmp_path / "home" / "course"  # widened to hold mypkg
    (tmp_path / "home" / "course" / "pyproject.toml").write_text("")
    assert snap.code_root(str(script)) == tmp_path / "home" / "course"  # the nearest project marker
    assert snap.code_root(str(script), snapshot=str(script.parent)) == script.parent  # --snapshot DIR wins
    # never the home directory: neither by a marker there nor by widening to it
    (tmp_path / "home" / "course" / "pyproject.toml").unlink()
    (tmp_path / "home" / ".git").mkdir()
    assert snap.project_root(script.parent) is None
    assert snap.widen(script.parent, [str(tmp_path / "home")]) == script.parent


# ------------------------------------------------------------------------------------------------- listing and copying
def _tree(root: Path) -> None:
    files = {
        "pkg/__init__.py": "x = 1\n",
        "train.py": "import pkg\n",
        "notes.txt": "n\n",
        "data/train.csv": "1,2\n",
        "mypkg/data/__init__.py": "",
        "model.pt": "weights",
        ".venv/lib/site.py": "",
        "env2/pyvenv.cfg": "",
        "env2/lib/x.py": "",
        "pkg/__pycache__/a.pyc": "",
        "pkg/b.pyc": "",
        "trainscale-jobs/old/job.sbatch": "",
        "out/run/x.txt": "",
        "thing.egg-info/PKG": "",
        "checkpoints/ckpt-00000004.pt": "w",
        "ckpt/step-2.pt": "w",
        "lumi-pytorch.sif": "image",
        "img.SQSH": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    with open(root / "big.dat", "wb") as handle:  # over the size limit: linked, not copied (sparse, no real bytes)
        handle.truncate(snap.LINK_BYTES + 1)
    (root / "latest").symlink_to("train.py")


def test_listing_copies_code_links_data_and_leaves_out_caches_and_outputs(tmp_path):
    root = tmp_path / "proj"
    _tree(root)
    manifest = snap.list_snapshot(root, exclude=[root / "out"])
    assert manifest.mode == "files"
    assert sorted(manifest.files) == ["latest", "mypkg/data/__init__.py", "notes.txt", "pkg/__init__.py", "train.py"]
    # a package named data is code, not data; a run's leftover checkpoints and the container image the job binds
    # by its own path are neither copied nor linked (the LUMI dry run listed them as "linked")
    assert manifest.links == ("big.dat", "data", "model.pt")
    dest = tmp_path / "run" / "src" / "proj"
    first = snap.write_snapshot(manifest, dest)
    assert (dest / "pkg" / "__init__.py").read_text() == "x = 1\n" and os.readlink(dest / "latest") == "train.py"
    assert (dest / "data").is_symlink() and (dest / "data" / "train.csv").read_text() == "1,2\n"
    assert not (dest / ".venv").exists() and not (dest / "env2").exists() and not (dest / "out").exists()
    assert first == snap.write_snapshot(manifest, tmp_path / "again")  # the hash depends on content only
    (root / "pkg" / "__init__.py").write_text("x = 2\n")
    assert snap.write_snapshot(snap.list_snapshot(root, exclude=[root / "out"]), tmp_path / "edited") != first


def test_a_git_work_tree_is_listed_by_git(tmp_path):
    root = tmp_path / "repo"
    _tree(root)
    (root / ".gitignore").write_text("data/\n*.pt\n.venv/\nenv2/\nbuild/\n")
    (root / "build").mkdir()
    (root / "build" / "gen.py").write_text("")
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "pkg/__init__.py", "train.py", "notes.txt", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    (root / "notes.txt").unlink()  # deleted in the work tree: not copied
    (root / "new_module.py").write_text("")  # untracked, not ignored: the user's new code is copied
    manifest = snap.list_snapshot(root / ".", exclude=[root / "out"])
    assert manifest.mode == "git"
    assert "new_module.py" in manifest.files and "train.py" in manifest.files and "notes.txt" not in manifest.files
    assert not any(f.startswith(("build/", "env2/", ".venv/", "trainscale-jobs/")) for f in manifest.files)
    assert "data" in manifest.links and "model.pt" in manifest.links  # ignored data: linked for __file__ paths
    assert "build" not in manifest.links
    assert not [p for p in (*manifest.files, *manifest.links) if p.startswith(("checkpoints", "ckpt", "lumi-", "img."))]


def test_a_snapshot_above_the_limits_is_refused_naming_the_largest(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    _tree(root)
    monkeypatch.setattr(snap, "MAX_FILES", 2)
    manifest = snap.list_snapshot(root)
    assert manifest.over_limit
    with pytest.raises(ConfigError, match=r"the snapshot of .*proj would copy more than 2 files") as caught:
        snap.write_snapshot(manifest, tmp_path / "dest")
    assert "--snapshot DIR" in caught.value.hint and not (tmp_path / "dest").exists()


# ----------------------------------------------------------------------------------- what the script reaches and lint
@pytest.mark.parametrize(
    "line, expected",
    [
        ("sys.path.append(os.path.join(os.path.dirname(__file__), '..'))", ("/c", False)),
        ("sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..', 'lib')))", ("/c/lib", True)),
        ("HERE = os.path.dirname(os.path.abspath(__file__))\nsys.path.append(HERE + '/../lib')", ("/c/lib", False)),
        ("sys.path.insert(0, str(Path(__file__).resolve().parents[1]))", ("/c", True)),
        ("sys.path.append(str(Path(__file__).parent.parent / 'lib'))", ("/c/lib", False)),
        ("ROOT = Path(__file__).parent\nsys.path.append(f'{ROOT}/..')", ("/c", False)),
        ("site.addsitedir(os.path.join(os.path.dirname(__file__), 'vendor'))", ("/c/scripts/vendor", False)),
    ],
)
def test_sys_path_forms_relative_to_the_script(line, expected):
    assert path_additions(ast.parse(line), "/c/scripts/train.py") == (expected,)


@pytest.mark.parametrize(
    "line", ["sys.path.append('/opt/site/lib')", "sys.path.append(os.environ['LIB'])", "sys.path.append(find_root())"]
)
def test_paths_that_do_not_move_with_the_script_or_need_running_it_are_left_out(line):
    assert path_additions(ast.parse(line), "/c/scripts/train.py") == ()


def test_lint_names_an_import_the_job_will_not_see(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = course(tmp_path / "course")
    assert [(n, optional) for n, _, optional in imported(ast.parse(COURSE_SCRIPT)) if n.startswith("mypkg")] == [
        ("mypkg", False),
        ("mypkg_extras", True),
    ]
    found = lint(SlurmJobSpec(script=str(script), profile="local-test", time="5"), builtin("local-test"))
    assert not [f for f in found if "will not see" in f.message]  # the snapshot was widened to hold mypkg
    narrow = SlurmJobSpec(script=str(script), profile="local-test", time="5", snapshot=str(script.parent))
    found = lint(narrow, builtin("local-test"))
    hit = [f for f in found if f.level == ERROR and "imports mypkg from" in f.message]
    assert len(hit) == 1 and "line 5" in hit[0].message and "will not see mypkg" in hit[0].message
    assert f"--snapshot {tmp_path / 'course'}" in hit[0].hint
    assert [f.level for f in found if "mypkg_extras" in f.message] == [WARNING]  # inside try: a warning
    outside = SlurmJobSpec(
        script=str(script), profile="local-test", time="5", snapshot=str(tmp_path / "course" / "mypkg")
    )
    assert [f.message for f in lint(outside, builtin("local-test")) if f.level == ERROR][0].startswith(
        f"the script {script} is outside --snapshot"
    )


# ------------------------------------------------------------------------------------------------ job-time arguments
def test_arguments_expand_job_time_variables_and_nothing_else(tmp_path):
    args = (
        "$OUT/$SLURM_JOB_ID",
        "${OUT}x",
        "a b",
        "*",
        "\\$HOME",
        "cost $5",
        "$(touch pwned)",
        "`touch pwned`",
        'it\'s "q"',
        "$$ $1 $@",
        "plain",
    )
    words, names = job_words(args)
    assert names == ("OUT", "SLURM_JOB_ID")
    (tmp_path / "glob-bait").write_text("")
    script = (
        "set -euo pipefail\nOUT='/o u t'\nSLURM_JOB_ID=42\n"
        + "\n".join(check_lines(names))
        + "\nprintf '%s\\n' "
        + " ".join(words)
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "/o u t/42",
        "/o u tx",
        "a b",
        "*",
        "$HOME",
        "cost $5",
        "$(touch pwned)",
        "`touch pwned`",
        'it\'s "q"',
        "$$ $1 $@",
        "plain",
    ]
    assert not (tmp_path / "pwned").exists()
    unset = subprocess.run(
        ["bash", "-c", "set -u\n" + "\n".join(check_lines(("OUTPUT_DIR",))) + "\necho ran"],
        capture_output=True,
        text=True,
    )
    assert unset.returncode == 1 and "ran" not in unset.stdout
    assert "the script's arguments use $OUTPUT_DIR, which is not set in the job" in unset.stderr
    assert "write \\$ for a literal $" in unset.stderr


# ---------------------------------------------------------------------------------------- module lines and the Python
def test_module_lines_per_profile_container_and_job():
    lumi = builtin("lumi")
    assert lumi.modules == ("module purge", "module load LUMI/25.03 partition/G") and lumi.modules_checked
    bare = SlurmJobSpec(script="/p/t.py", profile="lumi", time="5", modules=("load my-pytorch/2.4",))
    assert module_lines(bare, lumi) == (*lumi.modules, "module load my-pytorch/2.4")
    boxed = SlurmJobSpec(script="/p/t.py", profile="lumi", time="5", container="/i.sif")
    assert module_lines(boxed, lumi) == (
        "module use /appl/local/containers/ai-modules",
        "module load singularity-AI-bindings",
    )  # an image needs no stack
    own = SlurmJobSpec(
        script="/p/t.py", profile="lumi", time="5", profile_modules=False, modules=("load LUMI/24.03 partition/G",)
    )
    assert module_lines(own, lumi) == ("module load LUMI/24.03 partition/G",)
    text = render(own, lumi)
    assert "--no-profile-modules" in text and "module purge" not in text and "LUMI/25.03" not in text
    # the Python: a module's python3 (with the job kit), the image's, an absolute --python, or this interpreter
    assert (job_python(bare, lumi).command, job_python(bare, lumi).kit) == ("python3", True)
    assert (job_python(boxed, lumi).source, job_python(boxed, lumi).kit) == ("container", True)
    local = builtin("local-test")
    plain = SlurmJobSpec(script="/p/t.py", profile="local-test", time="5")
    assert (job_python(plain, local).command, job_python(plain, local).kit) == (sys.executable, False)
    venv = SlurmJobSpec(script="/p/t.py", profile="lumi", time="5", python="/p/venv/bin/python")
    assert job_python(venv, lumi).kit is False  # an absolute --python outside a container has trainscale
    text = render(bare, lumi)
    assert "python3 -m torch.distributed.run" in text and 'python3 "$KIT/port.py"' in text
    assert "# Python: python3 as found on the job's PATH after its module lines" in text


def test_the_cli_leaves_the_profiles_module_lines_out_on_request(tmp_path):
    from trainscale.cli.slurm import build

    spec, *_ = build(["--profile", "lumi", "-t", "5", "--no-profile-modules", "--module", "load X", "t.py"], {})
    assert spec.profile_modules is False and spec.modules == ("load X",)


def test_modules_checked_is_a_date():
    assert profile_from_dict({"modules_checked": "2026-11-24"}, name="x").modules_checked == "2026-11-24"
    import datetime

    assert profile_from_dict({"modules_checked": datetime.date(2026, 11, 24)}, name="x").modules_checked == "2026-11-24"
    with pytest.raises(ConfigError, match="modules_checked = 'last week' is not a date"):
        profile_from_dict({"modules_checked": "last week"}, name="x")
    with pytest.raises(ConfigError, match="container.modules must be a list of strings"):
        profile_from_dict({"container": {"modules": "module load x"}}, name="x")


def _fake_python(bin_dir: Path, *argv: str) -> Path:
    """A module's bin/ directory whose python3 runs ``argv``."""
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {" ".join(argv)} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    return bin_dir


def test_the_probe_loads_the_module_lines_and_names_the_python_and_torch(tmp_path, monkeypatch):
    from trainscale.launch.slurm.probe import probe_python

    spec = SlurmJobSpec(script="/p/t.py", profile="local-test", time="5", modules=("load PyTorch/2.4",))
    profile = builtin("local-test")
    bin_dir = _fake_python(tmp_path / "pytorch" / "bin", sys.executable)
    # a module system: the job's batch shell finds `module`; here an exported function stands in for Lmod
    monkeypatch.setenv("BASH_FUNC_module%%", f'() {{ [ "$1" = load ] && export PATH="{bin_dir}:$PATH"; }}')
    (note,) = probe_python(spec, profile, resolve(spec, profile))
    import torch

    assert note.level == NOTE and note.message.startswith(
        f"the job runs python3 as found on the job's PATH after its module lines: {sys.executable} (Python "
    )
    assert f"torch {torch.__version__}" in note.message
    # a module that gives a Python without torch is refused before submission, with the fix
    bare = _fake_python(tmp_path / "python-only" / "bin", sys.executable, "-I", "-S")  # no site-packages: no torch
    monkeypatch.setenv("BASH_FUNC_module%%", f'() {{ [ "$1" = load ] && export PATH="{bare}:$PATH"; }}')
    (error,) = probe_python(spec, profile, resolve(spec, profile))
    assert error.level == ERROR and "torch missing" in error.message and "cannot import torch" in error.message
    assert "--module 'load PyTorch/...'" in error.hint
    nowhere = SlurmJobSpec(
        script="/p/t.py", profile="local-test", time="5", modules=("load PyTorch/2.4",), python="python-nowhere"
    )  # a bare name: looked up after the module lines
    (error,) = probe_python(nowhere, profile, resolve(nowhere, profile))
    assert (
        error.level == ERROR and "there is no python-nowhere on the PATH after the job's module lines" in error.message
    )
    # no module system here: said, not guessed
    monkeypatch.delenv("BASH_FUNC_module%%")
    inits = ("/usr/share/lmod/lmod/init/bash", "/etc/profile.d/lmod.sh", "/etc/profile.d/modules.sh")
    if not any(os.path.exists(p) for p in inits):
        (later,) = probe_python(spec, profile, resolve(spec, profile))
        assert later.level == NOTE and "this machine has no `module` command" in later.message


def test_a_container_on_a_profile_without_a_container_table_is_a_note(tmp_path):
    image = tmp_path / "img.sif"
    image.write_text("")
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    found = lint(
        SlurmJobSpec(script=str(script), profile="local-test", time="5", container=str(image)), builtin("local-test")
    )
    assert [f.level for f in found if "no [container] table" in f.message] == [NOTE]
    assert not [f for f in found if f.level == WARNING and "container" in f.message]


# ------------------------------------------------------------------------------------ what SLURM itself says went wrong
LAYOUT_FAILURE = """\
srun: error: JobId=31 failed to distribute tasks (bind_type:sockets,mask_cpu,one_thread) - this should never happen
srun: error: Task launch for StepId=31.0 failed on node n1: Unable to layout tasks on given cpus
srun: error: Application launch failed: Unable to layout tasks on given cpus
srun: Job step aborted
"""


def test_a_step_slurm_could_not_start_is_named_not_blamed_on_a_rank(tmp_path):
    from trainscale.launch.slurm import explain
    from trainscale.launch.slurm.jobdir import JobRecord
    from trainscale.launch.slurm.queue import JobInfo
    from trainscale.launch.slurm.triage import step_failure

    rec = JobRecord(
        job_id="31",
        name="exp",
        launcher="srun",
        profile="local-test",
        script="s",
        output_dir=str(tmp_path),
        world_size=1,
        ranks_per_node=1,
        run_dir=str(tmp_path),
    )
    (tmp_path / "31" / "errors").mkdir(parents=True)
    rec.batch_output.write_text("trainscale: job 31 on n1, master n1:40000, restart 0, logs in x\n" + LAYOUT_FAILURE)
    text = explain(JobInfo(job_id="31", name="exp", state="FAILED", exit_code=1, signal=0), rec)
    assert "SLURM could not start the ranks: the step's tasks do not fit the CPUs" in text
    assert "Hint: give each task fewer CPUs (-c/--cpus-per-task)" in text and "traceback" not in text
    missing = step_failure("slurmstepd: error: execve(): /opt/venv/bin/python: No such file or directory\n")
    assert missing is not None and "/opt/venv/bin/python does not exist on the node" in missing.meaning


@pytest.mark.parametrize(
    "said, code, answer",
    [
        ("allocation failure: Unable to contact slurm controller (connect failure)", 1, "unreachable"),
        ("sbatch: fatal: Could not establish a configuration source", 1, "unreachable"),
        ("allocation failure: Requested node configuration is not available", 1, "refuses"),
        (
            "sbatch: Job 99 to start at 2026-11-24T09:00:00 using 8 processors on nodes n[1-2] in partition debug",
            0,
            "accepts",
        ),
    ],
)
def test_test_only_tells_an_unreachable_scheduler_from_a_refusal(said, code, answer):
    from trainscale.launch.slurm.submit import ask_test_only

    fake = lambda argv, **kw: subprocess.CompletedProcess(argv, code, "", said)  # noqa: E731
    assert ask_test_only("#!/bin/bash\n", run=fake) == (answer, said)


def test_a_module_linked_from_outside_the_snapshot_is_copied_so_the_job_imports_it(tmp_path):
    """issue 35 item 6a: the workshop's reference_solution/util.py -> ../util.py, snapshotted from
    reference_solution/ (no git): the link dangled in the job's copy and every rank failed with "No module named
    'util'". A link resolving inside the copy stays a link; one resolving outside it is copied as the file it is."""
    workshop = tmp_path / "workshop"
    (workshop / "reference_solution").mkdir(parents=True)
    (workshop / "util.py").write_text("VALUE = 7\n")
    (workshop / "reference_solution" / "train.py").write_text("import util\nprint(util.VALUE)\n")
    (workshop / "reference_solution" / "util.py").symlink_to("../util.py")
    (workshop / "reference_solution" / "same.py").symlink_to("train.py")
    root = workshop / "reference_solution"
    dest = tmp_path / "job" / "src"
    snap.write_snapshot(snap.list_snapshot(root), dest)
    assert not (dest / "util.py").is_symlink() and (dest / "util.py").read_text() == "VALUE = 7\n"
    assert os.readlink(dest / "same.py") == "train.py"
    done = subprocess.run([sys.executable, str(dest / "train.py")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "7", done.stderr


def test_an_arithmetic_expansion_in_the_arguments_is_computed_when_the_job_runs(tmp_path):
    """issue 35 item 6b: the workshop's `--num-workers $(( SLURM_CPUS_PER_TASK / SLURM_GPUS_PER_NODE ))` reached
    the script literally, to fail after the queue wait. Names, numbers and + - * / % ( ) expand as in a batch
    script; a command substitution inside one stays literal."""
    args = (
        "--num-workers",
        "$(( SLURM_CPUS_PER_TASK / SLURM_GPUS_PER_NODE ))",
        "$((2*(3+4)))",
        "$((1+$(touch pwned)))",
    )
    words, names = job_words(args)
    assert names == ("SLURM_CPUS_PER_TASK", "SLURM_GPUS_PER_NODE")
    script = (
        "set -euo pipefail\nSLURM_CPUS_PER_TASK=14\nSLURM_GPUS_PER_NODE=2\n"
        + "\n".join(check_lines(names))
        + "\nprintf '%s\\n' "
        + " ".join(words)
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["--num-workers", "7", "14", "$((1+$(touch pwned)))"]
    assert not (tmp_path / "pwned").exists()


def test_a_config_file_read_from_the_working_directory_is_named_at_submission(tmp_path, monkeypatch, capsys):
    """issue 35 item 6c: nanoGPT's `train.py config/train_gpt2.py` execs its config by a path from the working
    directory, which a job keeps (the directory submitted from): an edit after submission reached a held job
    while the docs said none would. The submission now says which file the job reads live."""
    from trainscale.cli.main import main

    (tmp_path / "config").mkdir()
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "config" / "train_gpt2.py").write_text("batch_size = 12\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINSCALE_STATE_DIR", str(tmp_path / "state"))
    assert (
        main(
            [
                "slurm",
                "--profile",
                "local-test",
                "-N",
                "1",
                "-t",
                "5",
                "--dry-run",
                "train.py",
                "config/train_gpt2.py",
                "--out_dir=out",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"note: the job reads config/train_gpt2.py from {tmp_path} when it runs, not from the snapshot" in err
