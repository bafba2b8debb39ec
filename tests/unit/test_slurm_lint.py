"""Lint before submission: each mistake from the seeds' Q&A is found, with a hint, at the right level."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainscale.errors import ConfigError
from trainscale.launch.slurm import SlurmJobSpec, lint
from trainscale.launch.slurm.lint import ERROR, WARNING, errors
from trainscale.profiles.loader import builtin_profile_dir, profile_from_file
from trainscale.profiles.schema import ClusterProfile


def builtin(name: str) -> ClusterProfile:
    return profile_from_file(builtin_profile_dir() / f"{name}.toml")


@pytest.fixture
def script(tmp_path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def only(findings, level: str, fragment: str):
    hits = [f for f in findings if f.level == level and fragment in f.message]
    assert len(hits) == 1, f"expected one {level} containing {fragment!r}, got {findings}"
    assert hits[0].hint, "every finding carries a hint"
    return hits[0]


def test_clean_job_has_no_findings(script):
    spec = SlurmJobSpec(script=script, profile="lumi", nodes=2, time="01:00:00", account="project_465000000")
    assert lint(spec, builtin("lumi")) == []


def test_many_tasks_per_node_with_torchrun(script):
    spec = SlurmJobSpec(
        script=script, profile="lumi", time="1:00:00", account="p", launcher="torchrun", tasks_per_node=8
    )
    f = only(lint(spec, builtin("lumi")), ERROR, "--ntasks-per-node=8 with the torchrun launch mode")
    assert "--ntasks-per-node=1" in f.hint


def test_tasks_per_node_from_extra_line_with_srun(script):
    spec = SlurmJobSpec(
        script=script,
        profile="lumi",
        time="1:00:00",
        account="p",
        launcher="srun",
        extra_sbatch=("--ntasks-per-node=4",),
    )
    f = only(lint(spec, builtin("lumi")), ERROR, "--ntasks-per-node=4 but 8 rank(s) per node")
    assert "--ntasks-per-node=8" in f.hint


def test_cpus_per_gpu_forbidden_on_lumi(script):
    spec = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", account="p", cpus_per_gpu=7)
    f = only(lint(spec, builtin("lumi")), ERROR, "--cpus-per-gpu on profile lumi")
    assert "--cpus-per-task" in f.hint
    # allowed elsewhere
    spec = SlurmJobSpec(script=script, profile="cyclone", time="1:00:00", cpus_per_gpu=10)
    assert errors(lint(spec, builtin("cyclone"))) == []


def test_over_specified_binding(script):
    spec = SlurmJobSpec(
        script=script, profile="cyclone", time="1:00:00", cpus_per_gpu=4, cpus_per_task=4, launcher="srun"
    )
    only(lint(spec, builtin("cyclone")), ERROR, "both --cpus-per-gpu=4 and --cpus-per-task=4")
    spec = SlurmJobSpec(script=script, profile="cyclone", time="1:00:00", launcher="torchrun", cpu_bind="mask_cpu:0xff")
    only(lint(spec, builtin("cyclone")), ERROR, "--cpu-bind=mask_cpu:0xff with the torchrun launch mode")
    spec = SlurmJobSpec(script=script, profile="cyclone", time="1:00:00", extra_sbatch=("--gpus-per-task=1",))
    only(lint(spec, builtin("cyclone")), ERROR, "GPUs are asked for twice")


def test_too_few_cpus_for_dataloader_workers(script):
    spec = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", account="p", dataloader_workers=8)
    f = only(lint(spec, builtin("lumi")), WARNING, "7 CPU(s) per rank but 8 DataLoader worker(s)")
    assert "at most 6 DataLoader workers" in f.hint
    ok = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", account="p", dataloader_workers=6)
    assert lint(ok, builtin("lumi")) == []


def test_memory_above_the_node(script):
    spec = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", account="p", mem_per_gpu="64G")
    f = only(lint(spec, builtin("lumi")), ERROR, "512 GB per node")
    assert "--mem-per-gpu 60G" in f.hint


def test_more_gpus_than_the_node_has(script):
    spec = SlurmJobSpec(script=script, profile="cyclone", time="1:00:00", gpus_per_node=8)
    only(lint(spec, builtin("cyclone")), ERROR, "--gpus-per-node 8 but a cyclone node has 4 GPU(s)")


def test_missing_account(script):
    spec = SlurmJobSpec(script=script, profile="lumi", time="1:00:00")
    f = only(lint(spec, builtin("lumi")), ERROR, "no --account")
    assert "--account" in f.hint
    with_extra = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", extra_sbatch=("--account=p",))
    assert lint(with_extra, builtin("lumi")) == []


def test_time_above_partition_limit(script):
    spec = SlurmJobSpec(script=script, profile="lumi", time="3-00:00:00", account="p")
    f = only(lint(spec, builtin("lumi")), ERROR, "--time 3-00:00:00 is above the partition's limit 2-00:00:00")
    assert "checkpoint" in f.hint


def test_unknown_partition_is_a_warning(script):
    spec = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", account="p", partition="standard")
    f = only(lint(spec, builtin("lumi")), WARNING, "partition 'standard'")
    assert "standard-g" in f.hint


def test_missing_script(tmp_path):
    spec = SlurmJobSpec(script=str(tmp_path / "nope.py"), profile="local-test", time="5")
    only(lint(spec, builtin("local-test")), ERROR, "does not exist")


def test_more_ranks_than_the_batch_can_feed():
    from trainscale.workloads.cnn import preflight

    # 64 synthetic samples cannot give 16 ranks a batch of 16 each
    spec = SlurmJobSpec(
        workload="cnn",
        args=("--data", "synthetic", "--samples", "64", "--batch-size", "16"),
        profile="local-test",
        nodes=2,
        gpus_per_node=8,
        time="5",
    )
    findings = lint(spec, builtin("local-test"), preflight=preflight)
    f = only(findings, ERROR, "cnn with world size 16")
    assert f.hint
    small = SlurmJobSpec(
        workload="cnn",
        args=("--data", "synthetic", "--samples", "64", "--batch-size", "4"),
        profile="local-test",
        nodes=2,
        gpus_per_node=2,
        time="5",
    )
    assert errors(lint(small, builtin("local-test"), preflight=preflight)) == []


def test_cpu_profile_oversubscription(script):
    spec = SlurmJobSpec(
        script=script, profile="local-test", time="5", gpus_per_node=2, cpus_per_task=4, launcher="srun"
    )
    only(lint(spec, builtin("local-test")), ERROR, "2 rank(s) x 4 CPU(s) = 8 CPUs per node")


def test_errors_come_first(script):
    spec = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", partition="x", dataloader_workers=9)
    levels = [f.level for f in lint(spec, builtin("lumi"))]
    assert levels == sorted(levels, key=lambda level: level != ERROR) and ERROR in levels and WARNING in levels


def test_cli_refuses_to_submit_on_errors(script, capsys, tmp_path):
    from trainscale.cli.main import main

    rc = main(
        [
            "slurm",
            "--profile",
            "lumi",
            "--time",
            "01:00:00",
            "--cpus-per-gpu",
            "7",
            "--output-dir",
            str(tmp_path / "jobs"),
            "--submit",
            script,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "error: --cpus-per-gpu on profile lumi" in err and "error: no --account" in err
    assert "hint:" in err and "not submitted" in err
    assert not (tmp_path / "jobs").exists()  # nothing written, nothing submitted


def test_config_error_for_missing_time(script):
    from trainscale.cli.slurm import build

    with pytest.raises(ConfigError, match="--time is required"):
        build(["--profile", "local-test", "--dry-run", script])


def test_cli_dry_run_prints_script_and_keeps_script_args(script, capsys):
    from trainscale.cli.main import main

    with open(script, "a") as fh:  # the script reads --nodes and --time itself: after it, they are its own
        fh.write(
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('--nodes')\np.add_argument('--time')\n"
        )
    rc = main(
        [
            "slurm",
            "--profile",
            "local-test",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--time",
            "10",
            "--launcher",
            "srun",
            "--dry-run",
            script,
            "--nodes",
            "7",
            "--time",
            "x",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "#SBATCH --nodes=2" in out and "#SBATCH --time=00:10:00" in out
    # after the script: the script's own options; the job runs the script in the run's snapshot (src/<dir>/)
    name = Path(script).parent.name
    assert re.search(rf"--script \S+/trainscale-train-\d{{8}}-\d{{6}}/src/{name}/train\.py --nodes 7 --time x", out), (
        out
    )
    assert Path(script).exists()


def test_the_jobs_gpus_not_the_login_nodes_decide_the_workload_checks():
    from trainscale.workloads.cnn import preflight

    # fp16 DeepSpeed needs a GPU: fine for a job on LUMI's GPU nodes even when planned on this CPU machine,
    # refused for a job on the CPU-only test cluster
    args = ("--data", "synthetic", "--samples", "256", "--batch-size", "4", "--strategy", "deepspeed:precision=fp16")
    gpu_job = SlurmJobSpec(workload="cnn", args=args, profile="lumi", time="1:00:00", account="p")
    assert errors(lint(gpu_job, builtin("lumi"), preflight=preflight)) == []
    cpu_job = SlurmJobSpec(workload="cnn", args=args, profile="local-test", time="5")
    only(lint(cpu_job, builtin("local-test"), preflight=preflight), ERROR, "fp16")


def test_container_image_that_is_not_here(script, tmp_path):
    spec = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", account="p", container="/no/such/image.sif")
    only(lint(spec, builtin("lumi")), ERROR, "container image /no/such/image.sif does not exist on this machine")
    uri = SlurmJobSpec(script=script, profile="lumi", time="1:00:00", account="p", container="docker://pytorch/pytorch")
    assert not errors(lint(uri, builtin("lumi")))  # a registry image is the runtime's to fetch


def test_trainscale_inside_a_stock_image_is_named(tmp_path):
    image = tmp_path / "pytorch.sif"
    image.write_text("")
    user = tmp_path / "uses_it.py"
    user.write_text("import trainscale\nwith trainscale.init() as rt:\n    pass\n")
    spec = SlurmJobSpec(script=str(user), profile="lumi", time="1:00:00", account="p", container=str(image))
    hit = only(lint(spec, builtin("lumi")), WARNING, "needs trainscale importable inside")
    assert "--system-site-packages" in hit.hint and "--python VENV/bin/python" in hit.hint
    with_python = SlurmJobSpec(
        script=str(user),
        profile="lumi",
        time="1:00:00",
        account="p",
        container=str(image),
        python="/project/p/venv/bin/python",
    )
    assert not [f for f in lint(with_python, builtin("lumi")) if "trainscale importable" in f.message]


def test_one_gpu_per_task_refused_for_a_script_that_picks_its_gpu_by_rank(tmp_path):
    seed = tmp_path / "cnn_multinode.py"
    seed.write_text(
        "import os, torch\nlocal_rank = int(os.environ['SLURM_LOCALID'])\n"
        "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])\n"
    )
    kw = dict(script=str(seed), profile="cyclone", time="1:00:00", launcher="srun")
    hit = only(
        lint(SlurmJobSpec(gpu_visibility="task", **kw), builtin("cyclone")),
        ERROR,
        "--gpu-visibility task shows each task only its own GPU",
    )
    assert "line 3" in hit.message and "--gpu-visibility node" in hit.hint
    note = [f for f in lint(SlurmJobSpec(**kw), builtin("cyclone")) if f.level == "note"]
    assert note and "line 3 picks its GPU by rank index" in note[0].message  # auto: all GPUs visible, said why


def test_sbatch_line_repeating_an_option(script):
    spec = SlurmJobSpec(script=script, profile="local-test", time="5", qos="high", extra_sbatch=("--qos=low",))
    only(lint(spec, builtin("local-test")), ERROR, "--qos is given twice")


def test_ntasks_and_gpus_per_node_that_disagree(script):
    spec = SlurmJobSpec(script=script, profile="generic-nvidia", time="5", nodes=2, ntasks=8, gpus_per_node=2)
    only(lint(spec, builtin("generic-nvidia")), ERROR, "-n/--ntasks 8 but --nodes 2 x --gpus-per-node 2 = 4 ranks")


def test_partial_node_and_unlimited_time_are_explained(script):
    spec = SlurmJobSpec(
        script=script, profile="lumi", time="UNLIMITED", account="p", gpus_per_node=4, partition="small-g"
    )
    found = lint(spec, builtin("lumi"))
    assert not errors(found)
    assert any(f.level == "note" and "without --exclusive" in f.message for f in found)
    assert any(f.level == "note" and "the partition's own limit" in f.message for f in found)


def test_both_memory_options_are_refused(script):
    with pytest.raises(ConfigError, match="both --mem and --mem-per-gpu"):
        SlurmJobSpec(script=script, time="5", mem="100G", mem_per_gpu="10G")


@pytest.mark.parametrize(
    "source, warned",
    [
        ("print('hi')\n", True),  # no trainscale at all: the warning signal would end it, too
        (
            "import torch\nimport trainscale\nfrom torch.utils.checkpoint import checkpoint\n"
            "with trainscale.init() as rt:\n    y = torch.utils.checkpoint.checkpoint(f, x)\n"
            "    z = checkpoint(f, x)\n",
            True,
        ),
        (
            "import trainscale\nwith trainscale.init() as rt:\n    start = rt.resume(model, opt)\n"
            "    rt.checkpoint(1, model, opt)\n",
            False,
        ),
        ("from trainscale.checkpoint import Checkpointer\nckpt = Checkpointer('c', rt)\n", False),
        ("from trainscale.train import Loop, Task\nLoop(rt, opts, task).run()\n", False),
    ],
)
def test_requeue_or_chain_of_a_script_that_does_not_checkpoint_through_trainscale_warns(tmp_path, source, warned):
    path = tmp_path / "train.py"
    path.write_text(source)
    for continued in ({"requeue": True}, {"chain": 2}):
        spec = SlurmJobSpec(script=str(path), profile="lumi", time="01:00:00", account="project_465000000", **continued)
        hits = [f for f in lint(spec, builtin("lumi")) if "does not checkpoint through trainscale" in f.message]
        assert len(hits) == int(warned), hits
        if warned:
            assert hits[0].level == WARNING and "rt.resume(model, optimizer)" in hits[0].hint
            assert ("--requeue" if "requeue" in continued else "--chain 2") in hits[0].message
    plain = SlurmJobSpec(script=str(path), profile="lumi", time="01:00:00", account="project_465000000")
    assert not [f for f in lint(plain, builtin("lumi")) if "checkpoint through" in f.message]  # no requeue: no word
    workload = SlurmJobSpec(workload="cnn", profile="lumi", time="01:00:00", account="project_465000000", requeue=True)
    assert not [f for f in lint(workload, builtin("lumi")) if "checkpoint through" in f.message]


def test_the_partition_here_checks_the_job_with_its_real_sizes(script):
    """sinfo's rows (one per node shape or state, ``+`` where some nodes have more) make one partition;
    a job larger than it is an error before sbatch; another cluster's partition is not judged here."""
    from trainscale.launch.slurm import cluster
    from trainscale.launch.slurm.spec import resolve

    rows = "gpu*|3|64|257000+\ngpu*|1|128|515000\ndebug|2|4+|8000\n"
    parts = cluster.parse(rows)
    assert parts["gpu"] == cluster.Partition("gpu", True, 4, 64, 257000 / 1024)
    assert cluster.partitions(run=lambda *a, **k: type("Done", (), {"returncode": 0, "stdout": rows})()) == parts
    assert cluster.partitions(run=lambda *a, **k: type("Done", (), {"returncode": 1, "stdout": ""})()) is None

    profile = builtin("local-test")
    fits = SlurmJobSpec(script=script, profile="local-test", nodes=4, time="5", partition="gpu")
    assert cluster.findings(resolve(fits, profile), profile, parts) == ([], True)
    big = SlurmJobSpec(script=script, profile="local-test", nodes=5, time="5", mem="300G", partition="gpu")
    found, here = cluster.findings(resolve(big, profile), profile, parts)
    assert here and [f.level for f in found] == [ERROR, ERROR]
    only(found, ERROR, "--nodes 5 but partition gpu (sinfo -p gpu) has 4 node(s)")
    assert only(found, ERROR, "300 GB per node asked for (--mem 300G)").hint == "use --mem 251G or less"

    lumi = SlurmJobSpec(script=script, profile="lumi", nodes=2, time="01:00:00", account="project_465000000")
    found, here = cluster.findings(resolve(lumi, builtin("lumi")), builtin("lumi"), parts)
    assert not here and "no partition 'standard-g' (it has gpu, debug)" in only(found, "note", "standard-g").message
    assert cluster.findings(resolve(lumi, builtin("lumi")), builtin("lumi"), None) == ([], True)  # no sinfo here
    # the profile's cluster is this one (its partition debug is here): a partition it lacks is sbatch's to refuse
    typo = SlurmJobSpec(script=script, profile="local-test", nodes=2, time="5", partition="nosuchpart")
    assert cluster.findings(resolve(typo, profile), profile, parts) == ([], True)
    listed = SlurmJobSpec(script=script, profile="local-test", nodes=3, time="5", partition="nosuch,debug")
    found, here = cluster.findings(resolve(listed, profile), profile, parts)  # -p a,b: the first that is here
    assert here and "partition debug" in only(found, ERROR, "--nodes 3").message
    nodefault = cluster.parse("gpu|3|64|257000\n")
    bare0 = ClusterProfile(name="bare0", gpus_per_node=0, cpus_per_node=4)
    assert cluster.findings(
        resolve(SlurmJobSpec(script=script, profile="bare0", nodes=9, time="5"), bare0), bare0, nodefault
    ) == ([], True)  # nothing asked, no default: the scheduler answers
    bare = ClusterProfile(name="bare", gpus_per_node=0, cpus_per_node=4)  # no partition named: the default one
    found, here = cluster.findings(
        resolve(SlurmJobSpec(script=script, profile="bare", nodes=5, time="5"), bare), bare, parts
    )
    assert here and "partition gpu" in only(found, ERROR, "--nodes 5").message
