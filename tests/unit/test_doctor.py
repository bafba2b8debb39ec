"""trainscale doctor in one process: each section, the threads/workers checks, the network checks' errors."""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest

from trainscale.doctor import (
    SECTIONS,
    Devices,
    Finding,
    Report,
    Versions,
    check_port_free,
    check_port_listening,
    check_resolution,
    collect_binding,
    collect_devices,
    collect_threads,
    collect_versions,
    cpus_per_rank,
    render,
    run_network,
)
from trainscale.doctor.main import main
from trainscale.doctor.network import ALONE, check_overlap
from trainscale.env import LaunchEnv
from trainscale.errors import ConfigError
from trainscale.topology import GpuInfo, NumaNode, Topology, current_affinity

CPUS = len(current_affinity())


def _report(capsys, argv, environ) -> dict:
    main([*argv, "--json"], environ=environ)
    return json.loads(capsys.readouterr().out)


def _find(report: dict, check: str) -> dict:
    return next(f for f in report["findings"] if f["check"] == check)


def test_single_process_text_report_has_every_section_and_a_summary(capsys):
    code = main([], environ={})
    text = capsys.readouterr().out
    assert code == 0
    for section in SECTIONS:
        assert f"== {section} ==" in text
    for check in (
        "trainscale",
        "python",
        "torch",
        "nccl",
        "deepspeed",
        "transformers",
        "topology",
        "detected",
        "affinity",
        "OMP_NUM_THREADS",
        "DataLoader workers",
    ):
        assert f"] {check}" in text, check
    assert "single: rank 0/1" in text
    assert "Summary:" in text


def test_omp_threads_above_cpus_per_rank_warns_with_a_hint(capsys):
    report = _report(capsys, [], {"OMP_NUM_THREADS": str(CPUS + 3)})
    omp = _find(report, "OMP_NUM_THREADS")
    assert omp["level"] == "warning"
    assert f"OMP_NUM_THREADS={CPUS + 3}" in omp["message"]
    assert f"export OMP_NUM_THREADS={CPUS}" in omp["hint"]


def test_omp_threads_within_cpus_is_ok(capsys):
    assert _find(_report(capsys, [], {"OMP_NUM_THREADS": "1"}), "OMP_NUM_THREADS")["level"] == "ok"


def test_unbound_local_ranks_share_the_affinity_so_omp_counts_against_a_share():
    env = LaunchEnv(
        source="torchrun",
        rank=0,
        local_rank=0,
        world_size=4,
        local_world_size=4,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
    )
    cpus, why = cpus_per_rank(env, Topology(cpus=tuple(range(8))), frozenset(range(8)), {})
    assert cpus == 2 and "shared by 4 local ranks" in why
    found = {f.check: f for f in collect_threads({"OMP_NUM_THREADS": "8"}, cpus, why)}
    assert found["OMP_NUM_THREADS"].level == "warning" and "OMP_NUM_THREADS=2" in found["OMP_NUM_THREADS"].hint
    # srun binds each task to its own CPUs: a set smaller than the node's is the rank's own.
    srun = LaunchEnv(
        source="slurm",
        rank=0,
        local_rank=0,
        world_size=4,
        local_world_size=4,
        node_rank=0,
        num_nodes=1,
        master_addr="n1",
        master_port=29500,
    )
    assert cpus_per_rank(srun, Topology(cpus=tuple(range(8))), frozenset({0, 1}), {})[0] == 2
    # srun tasks given RANK/LOCAL_RANK (detected as torchrun) are still bound by srun, not by an agent
    assert cpus_per_rank(env, Topology(cpus=tuple(range(8))), frozenset({0, 1}), {})[0] == 2
    by_agent = dataclasses.replace(env, elastic_agent=True)  # torchrun's agent started it (TORCHELASTIC_RUN_ID)
    assert cpus_per_rank(by_agent, Topology(cpus=tuple(range(8))), frozenset({0, 1}), {})[0] == 1


def test_bad_omp_value_is_an_error():
    found = {f.check: f for f in collect_threads({"OMP_NUM_THREADS": "lots"}, 4, "4 CPUs")}
    assert found["OMP_NUM_THREADS"].level == "error" and "OMP_NUM_THREADS=4" in found["OMP_NUM_THREADS"].hint


def test_more_workers_than_cpus_per_rank_warns(capsys):
    report = _report(capsys, ["--workers", str(CPUS + 1)], {})
    workers = _find(report, "DataLoader workers")
    assert workers["level"] == "warning"
    assert f"{CPUS + 1} DataLoader worker(s)" in workers["message"] and workers["hint"]
    assert _find(_report(capsys, ["--workers", "0"], {}), "DataLoader workers")["level"] == "ok"


def test_binding_plan_not_applied_warns_and_applied_plan_is_ok():
    env = LaunchEnv(
        source="torchrun",
        rank=1,
        local_rank=1,
        world_size=2,
        local_world_size=2,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
    )
    topo = Topology(cpus=tuple(range(8)), numa_nodes=(NumaNode(index=0, cpus=tuple(range(8))),))
    plan = {"TRAINSCALE_CPU_BIND": "-:0-3/-:4-7"}
    not_applied = {f.check: f for f in collect_binding(env, topo, frozenset(range(8)), plan)}
    assert not_applied["plan"].level == "warning" and "4-7" in not_applied["plan"].message
    applied = {f.check: f for f in collect_binding(env, topo, frozenset({4, 5, 6, 7}), plan)}
    assert applied["plan"].level == "ok" and "bound as planned" in applied["plan"].message
    unusable = {f.check: f for f in collect_binding(env, topo, frozenset(range(8)), {"TRAINSCALE_CPU_BIND": "-:0-3"})}
    assert unusable["plan"].level == "warning" and "1 local ranks but this node runs 2" in unusable["plan"].message


def test_cores_far_from_the_gpu_warn():
    env = LaunchEnv(source="single", rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1)
    topo = Topology(cpus=tuple(range(16)), gpus=(GpuInfo(index=0, vendor="nvidia", cpus=tuple(range(8, 16))),))
    found = {f.check: f for f in collect_binding(env, topo, frozenset(range(8)), {"TRAINSCALE_CPU_BIND": "0:0-7"})}
    assert found["GPU locality"].level == "warning" and "GPU 0" in found["GPU locality"].message


def test_locality_is_checked_against_the_visible_gpu_the_rank_drives():
    """CUDA_VISIBLE_DEVICES=1: local rank 0 drives the node's GPU 1, whose close cores are 8-15; running
    on 0-7 (close to GPU 0) was reported fine when rank 0 was taken to drive GPU 0."""
    env = LaunchEnv(source="single", rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1)
    topo = Topology(
        cpus=tuple(range(16)),
        gpus=(
            GpuInfo(index=0, vendor="nvidia", cpus=tuple(range(8))),
            GpuInfo(index=1, vendor="nvidia", cpus=tuple(range(8, 16))),
        ),
    )
    found = {f.check: f for f in collect_binding(env, topo, frozenset(range(8)), {"CUDA_VISIBLE_DEVICES": "1"})}
    assert found["GPU locality"].level == "warning" and "GPU 1" in found["GPU locality"].message
    fine = {f.check: f for f in collect_binding(env, topo, frozenset(range(8, 16)), {"CUDA_VISIBLE_DEVICES": "1"})}
    assert "GPU locality" not in fine


def test_gpus_on_the_node_but_a_cpu_only_torch_is_explained():
    versions = Versions(trainscale="0", python="3", executable="py", platform="Linux", torch="2.0+cpu")
    devices = Devices(accelerator="none", topology=Topology(gpus=(GpuInfo(index=0, vendor="nvidia"),)))
    found = {f.check: f for f in collect_devices(devices, versions)}
    assert found["accelerators"].level == "warning" and "CPU-only build" in found["accelerators"].hint


def test_versions_never_fail_without_torch_or_optional_packages():
    versions = Versions(
        trainscale="0",
        python="3",
        executable="py",
        platform="Linux",
        torch_error="ImportError: x",
        packages={"deepspeed": None, "transformers": "4.40.0"},
    )
    found = {f.check: f for f in collect_versions(versions)}
    assert found["torch"].level == "error" and "ImportError" in found["torch"].message
    assert found["deepspeed"].message == "not installed" and found["transformers"].message == "4.40.0"
    cuda = Versions(
        trainscale="0",
        python="3",
        executable="py",
        platform="Linux",
        torch="2.4",
        cuda="12.4",
        nccl="2.20.5",
        backends=("gloo", "nccl"),
    )
    found = {f.check: f for f in collect_versions(cuda)}
    assert "CUDA 12.4" in found["torch"].message and found["nccl"].message == "NCCL 2.20.5"


def test_a_warning_without_a_hint_is_refused():
    with pytest.raises(ConfigError, match="no hint"):
        Finding(section="Versions", check="x", level="warning", message="m")
    with pytest.raises(ConfigError, match="not one of"):
        Finding(section="Versions", check="x", level="bad", message="m", hint="h")


def test_unresolvable_master_is_an_error_naming_host_and_port():
    finding, address = check_resolution("no-such-host.invalid", 29555)
    assert address is None and finding.level == "error"
    assert "no-such-host.invalid" in finding.message and "29555" in finding.message and "MASTER_ADDR" in finding.hint


def test_unresolvable_master_stops_a_rank_before_the_process_group():
    env = LaunchEnv(
        source="torchrun",
        rank=1,
        local_rank=1,
        world_size=2,
        local_world_size=2,
        node_rank=0,
        num_nodes=1,
        master_addr="no-such-host.invalid",
        master_port=29555,
    )
    findings, outcome = run_network(env, {}, host="h", affinity=frozenset({0}), timeout_s=5)
    assert outcome == ALONE
    assert [(f.rank, f.level, f.check) for f in findings] == [(1, "error", "master address")]


def test_port_probe_reports_a_closed_port_by_host_and_port_and_an_open_one_ok():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        closed = check_port_listening("localhost", "127.0.0.1", port, wait_s=0)  # bound, not listening
        assert closed.level == "error" and f"localhost:{port}" in closed.message
        busy = check_port_free("localhost", "127.0.0.1", port)
        assert busy.level == "error" and f"localhost:{port}" in busy.message
        sock.listen(1)
        assert check_port_listening("localhost", "127.0.0.1", port, wait_s=0).level == "ok"


def test_single_process_network_explains_there_is_nothing_to_probe(capsys):
    network = _find(_report(capsys, ["--network"], {}), "network")
    assert network["level"] == "ok" and "single process" in network["message"] and "--nproc 2" in network["hint"]


def test_ranks_sharing_cpus_on_one_host_warn():
    def host(rank, name, cpus, node=0):
        return Finding(
            section=SECTIONS[-1],
            check="host",
            level="ok",
            message="",
            rank=rank,
            detail={"host": name, "cpus": cpus, "node": node},
        )

    # two nodes emulated on one machine share a host name but not their cores
    assert check_overlap([host(0, "a", [0, 1]), host(1, "a", [0, 1], node=1)])[0].level == "ok"
    assert check_overlap([host(0, "a", [0, 1]), host(1, "a", [2, 3]), host(2, "b", [0, 1])])[0].level == "ok"
    clash = check_overlap([host(0, "a", [0, 1]), host(1, "a", [1, 2])])[0]
    assert clash.level == "warning" and "ranks 0 and 1 on a (node 0) share CPUs 1" in clash.message


def test_json_round_trips_and_text_shows_every_hint():
    finding = Finding(section="Versions", check="torch", level="error", message="gone", hint="install it")
    report = Report(host="h", created="t", command="c", findings=(finding,))
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    text = render(report)
    assert "[ERROR] torch" in text and "hint: install it" in text and "1 error(s)" in text


def test_cli_doctor_prints_json(capsys):
    from trainscale.cli.main import main as cli

    cli(["doctor", "--json", "--workers", "0"])
    data = json.loads(capsys.readouterr().out)
    assert {f["section"] for f in data["findings"]} == set(SECTIONS)


def test_a_loaded_machine_is_a_warning_not_ok():
    """`doctor` said [ok] to everything at load 12 on 2 cores (issue 38): the load past the cores, less this
    launch's own ranks, is named."""
    from trainscale.doctor.local import collect_load

    (busy,) = collect_load(12.0, cores=2, ranks_here=2)
    assert busy.level == "warning" and busy.message.startswith("load average 12.0 on 2 core(s): other work")
    assert busy.hint and busy.detail == {"load": 12.0, "cores": 2}
    assert collect_load(3.5, cores=2, ranks_here=2)[0].level == "ok"  # its own two ranks are not other work
    assert collect_load(None, cores=2)[0].level == "ok"
