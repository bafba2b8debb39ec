"""`trainscale bench --slurm`: one SLURM job per configuration, all checked before the first is submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainscale.bench import configs
from trainscale.bench.runner import job_specs
from trainscale.bench.slurm_runs import SlurmTarget, prepare
from trainscale.bench.study import StudySpec, plan
from trainscale.cli import bench as cli
from trainscale.errors import ConfigError

LOCAL = dict(profile="local-test", time="00:10:00")


def test_nodes_add_node_configurations():
    assert configs.with_nodes(None, (1, 2)) == "1n,2n"
    assert configs.with_nodes("cpu,1", (2,)) == "cpu,1,2n"
    assert configs.with_nodes("1,2n", (2,)) == "1,2n"
    assert configs.with_nodes(None, ()) == "1,2"


def test_each_configuration_becomes_the_job_trainscale_slurm_would_submit(tmp_path):
    spec = StudySpec(workload="cnn", configs="cpu,2,2n,2x1", epochs=1, slurm=SlurmTarget(ranks_per_node=2, **LOCAL))
    the_plan = plan(spec)
    jobs = job_specs(the_plan, tmp_path)
    shape = {name: (j.nodes, j.gpus_per_node, j.workload is None and j.module) for name, j in jobs.items()}
    assert shape == {
        "01-cpu": (1, 1, "trainscale.workloads"),
        "02-2": (1, 2, "trainscale.workloads"),
        "03-2n": (2, 2, "trainscale.workloads"),
        "04-2x1": (2, 1, "trainscale.workloads"),
    }
    job = jobs["03-2n"]
    metrics = tmp_path.absolute() / "runs" / "03-2n" / "metrics.json"
    assert job.args[0] == "cnn" and job.args[-2:] == ("--metrics-out", str(metrics))
    assert "TRAINSCALE_METRICS_OUT" not in job.env and job.output_dir == metrics.parent / "job"  # timing: the records
    assert "--device" in jobs["01-cpu"].args  # the cpu configuration stays on the CPU on a GPU node too
    prepared = prepare(spec.slurm, jobs)
    assert prepared["03-2n"].plan.world_size == 4


def test_a_job_slurm_would_refuse_stops_the_study_before_any_submission(tmp_path):
    spec = StudySpec(workload="cnn", configs="1,2n", slurm=SlurmTarget(profile="lumi", time="00:10:00"))
    with pytest.raises(ConfigError, match="run 01-1: no --account") as err:
        prepare(spec.slurm, job_specs(plan(spec), tmp_path / "study"))
    assert "--account PROJECT" in err.value.hint
    assert not (tmp_path / "study").exists()


def test_node_counts_need_ranks_per_node_on_a_cpu_profile():
    with pytest.raises(ConfigError, match="no GPUs per node") as err:
        plan(StudySpec(workload="cnn", configs="2n", slurm=SlurmTarget(**LOCAL)))
    assert "--gpus-per-node" in err.value.hint


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--time", "00:10:00"], "--time only apply to SLURM jobs"),
        (["--nodes", "1,2"], "--nodes only apply to SLURM jobs"),
        (["--slurm", "--time", "00:10:00"], "--slurm needs --profile and --time"),
        (["--slurm", "--profile", "local-test"], "--slurm needs --profile and --time"),
        (["--slurm", "--profile", "no-such-profile", "--time", "1"], "no-such-profile"),
        (["--slurm", "--profile", "local-test", "--time", "soon"], "soon"),
    ],
)
def test_slurm_options_are_checked_before_anything_runs(argv, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        cli.build([*argv, "--workload", "cnn", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_cli_builds_the_slurm_study():
    spec, _ = cli.build(
        [
            "--slurm",
            "--profile",
            "local-test",
            "--time",
            "00:05:00",
            "--gpus-per-node",
            "2",
            "--configs",
            "1",
            "--nodes",
            "2",
            "--launcher",
            "srun",
            "--workload",
            "cnn",
        ]
    )
    assert spec.configs == "1,2n" and spec.slurm.launcher == "srun" and spec.slurm.nodes_ranks == 2
    assert [c.world_size for c in spec.parsed_configs()] == [1, 4]


def test_allreduce_refuses_slurm_options_without_slurm(capsys):
    with pytest.raises(ConfigError, match="--profile only apply"):
        cli.run_allreduce(["--profile", "local-test"])
    with pytest.raises(ConfigError, match="no GPUs per node"):
        cli.run_allreduce(
            ["--slurm", "--profile", "local-test", "--time", "00:05:00", "--out", str(Path("/nonexistent"))]
        )


def test_allreduce_refuses_a_hook_it_cannot_time(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.run_allreduce(["--hook", "nccl", "--out", str(tmp_path / "ar")])
    assert "argument --hook: invalid choice: 'nccl' (choose from 'none', 'shm', 'auto')" in capsys.readouterr().err
    assert not (tmp_path / "ar").exists()  # refused before anything is written or launched
