"""Topology parsing and binding plans on captured tool output and fake sysfs trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainscale.errors import ConfigError
from trainscale.topology import (
    BindingPlan,
    Topology,
    cores_to_mask,
    detect_topology,
    format_cpulist,
    mask_to_cores,
    parse_cpulist,
    parse_nvidia_topo,
    parse_rocm_toponuma,
    plan_binding,
    plan_cpu_only,
    read_core_of,
    read_numa_nodes,
    read_online_cpus,
    read_pci_gpus,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "topology"
LUMI_MAP = {0: "49-55", 1: "57-63", 2: "17-23", 3: "25-31", 4: "1-7", 5: "9-15", 6: "33-39", 7: "41-47"}
LUMI_RESERVED = (0, 8, 16, 24, 32, 40, 48, 56)
LUMI_MASKS = "0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00,0xfe00000000,0xfe0000000000"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def write_sysfs(root: Path, numa: dict[int, str], cores: int, threads: int) -> Path:
    """A fake sysfs tree: NUMA node cpulists, online CPUs, SMT siblings numbered core, core+cores, ..."""
    base = root / "sys/devices/system"
    for node, cpus in numa.items():
        (base / f"node/node{node}").mkdir(parents=True)
        (base / f"node/node{node}/cpulist").write_text(cpus + "\n")
    (base / "cpu").mkdir(parents=True)
    (base / "cpu/online").write_text(f"0-{cores * threads - 1}\n")
    for cpu in range(cores * threads):
        topo = base / f"cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        core = cpu % cores
        topo.joinpath("thread_siblings_list").write_text(",".join(str(core + t * cores) for t in range(threads)) + "\n")
    return root


# --- cpulists and masks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, cores",
    [
        ("0-3,8-11", (0, 1, 2, 3, 8, 9, 10, 11)),
        ("49-55", tuple(range(49, 56))),
        ("1-7,9-15", (*range(1, 8), *range(9, 16))),
        ("5", (5,)),
        (" 3, 1 ,2", (1, 2, 3)),
        ("", ()),
    ],
)
def test_parse_cpulist(text, cores):
    assert parse_cpulist(text) == cores


@pytest.mark.parametrize("bad", ["1-", "a-3", "7-1", "1,,x", "-2"])
def test_parse_cpulist_rejects_garbage(bad):
    with pytest.raises(ConfigError, match="core list"):
        parse_cpulist(bad)


def test_format_cpulist_round_trips():
    for text in ("0-3,8-11", "1-7,9-15,17-23", "0,2,4", "63"):
        assert format_cpulist(parse_cpulist(text)) == text
    assert format_cpulist([3, 1, 2, 2, 10]) == "1-3,10"


def test_mask_for_lumi_gcd0_is_published_value():
    assert cores_to_mask(parse_cpulist("49-55")) == "0xfe000000000000"
    assert cores_to_mask(parse_cpulist("57-63")) == "0xfe00000000000000"
    assert cores_to_mask([0, 1]) == "0x3"


def test_mask_conversion_both_ways():
    for gcd, published in zip(range(8), LUMI_MASKS.split(",")):
        assert mask_to_cores(published) == parse_cpulist(LUMI_MAP[gcd])
        assert cores_to_mask(mask_to_cores(published)) == published
    assert mask_to_cores("C") == (2, 3)  # SLURM also accepts masks without 0x
    for cores in ([0], [127], [1, 64, 100]):
        assert mask_to_cores(cores_to_mask(cores)) == tuple(cores)


def test_mask_errors():
    with pytest.raises(ConfigError, match="empty core set"):
        cores_to_mask([])
    with pytest.raises(ConfigError, match="not a hex CPU mask"):
        mask_to_cores("0xZZ")


# --- tool output parsers ------------------------------------------------------------------------------------


def test_nvidia_topo_8gpu_dgx():
    gpus = parse_nvidia_topo(fixture("nvidia-smi-topo-dgx-a100-8gpu.txt"))
    assert [g.index for g in gpus] == list(range(8))
    assert {g.vendor for g in gpus} == {"nvidia"}
    assert [g.numa_node for g in gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert format_cpulist(gpus[0].cpus) == "48-63,176-191"
    assert format_cpulist(gpus[4].cpus) == "112-127,240-255"
    assert len(gpus[7].cpus) == 32


def test_nvidia_topo_4gpu_older_format():
    gpus = parse_nvidia_topo(fixture("nvidia-smi-topo-hgx-a100-4gpu.txt"))
    assert [(g.index, format_cpulist(g.cpus), g.numa_node) for g in gpus] == [
        (0, "0-19,40-59", 0),
        (1, "0-19,40-59", 0),
        (2, "20-39,60-79", 1),
        (3, "20-39,60-79", 1),
    ]


def test_nvidia_topo_na_affinity_and_missing_header():
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tN/A\tN/A\n"
    (gpu,) = parse_nvidia_topo(text)
    assert gpu.cpus == () and gpu.numa_node is None
    with pytest.raises(ConfigError, match="CPU Affinity"):
        parse_nvidia_topo("No devices were found\n")


def test_rocm_toponuma_lumi():
    assert parse_rocm_toponuma(fixture("rocm-smi-showtoponuma-lumi-g.txt")) == {
        0: 3,
        1: 3,
        2: 1,
        3: 1,
        4: 0,
        5: 0,
        6: 2,
        7: 2,
    }
    assert parse_rocm_toponuma("GPU[0]\t\t: (Topology) Numa Node: -1\n") == {}


# --- sysfs --------------------------------------------------------------------------------------------------


def test_sysfs_fixture_tree():
    root = FIXTURES / "sysfs-2numa-smt"
    nodes = read_numa_nodes(root)
    assert [(n.index, format_cpulist(n.cpus)) for n in nodes] == [(0, "0-3,8-11"), (1, "4-7,12-15")]  # node2: no CPUs
    assert read_online_cpus(root) == tuple(range(16))
    core_of = read_core_of(root, tuple(range(16)))
    assert core_of[9] == 1 and core_of[1] == 1 and core_of[15] == 7
    gpus = read_pci_gpus(root)  # the Mellanox NIC in between is not a GPU
    assert [(g.index, g.vendor, g.numa_node, format_cpulist(g.cpus)) for g in gpus] == [
        (0, "nvidia", 0, "0-3,8-11"),
        (1, "nvidia", 1, "4-7,12-15"),
    ]


def test_sysfs_missing_tree_is_empty(tmp_path):
    assert read_numa_nodes(tmp_path) == () and read_online_cpus(tmp_path) == () and read_pci_gpus(tmp_path) == ()


# --- planning -----------------------------------------------------------------------------------------------


def test_lumi_plan_equals_published_map():
    plan = plan_binding(LUMI_MAP, 8, reserved=LUMI_RESERVED)
    assert [(r.local_rank, r.gpu, r.cpulist) for r in plan.ranks] == [(g, g, LUMI_MAP[g]) for g in range(8)]
    assert plan.mask_list() == LUMI_MASKS
    assert plan.cpu_bind_option() == f"--cpu-bind=mask_cpu:{LUMI_MASKS}"
    assert not plan.shared


def test_reserved_cores_are_never_bound():
    plan = plan_binding({0: "0-7", 1: "8-15"}, 2, reserved=(0, 8))
    assert [r.cpulist for r in plan.ranks] == ["1-7", "9-15"]
    with pytest.raises(ConfigError, match="no close cores left"):
        plan_binding({0: "0"}, 1, reserved=(0,))


def test_lumi_detected_from_rocm_and_sysfs_matches_map(tmp_path):
    # LUMI-G: 64 cores x 2 threads, NPS4: NUMA node k holds cores 16k..16k+15 and their SMT siblings.
    numa = {k: f"{16 * k}-{16 * k + 15},{64 + 16 * k}-{64 + 16 * k + 15}" for k in range(4)}
    root = write_sysfs(tmp_path, numa, cores=64, threads=2)
    rocm = fixture("rocm-smi-showtoponuma-lumi-g.txt")
    topo = detect_topology(root, run=lambda argv: rocm if argv[0] == "rocm-smi" else None)
    assert [g.vendor for g in topo.gpus] == ["amd"] * 8
    plan = plan_binding(topo, 8, reserved=LUMI_RESERVED)
    for rank in plan.ranks:
        physical = [c for c in rank.cpus if topo.core_of[c] == c]
        assert format_cpulist(physical) == LUMI_MAP[rank.gpu]
        assert {topo.core_of[c] for c in rank.cpus} == set(physical)  # SMT siblings travel with their core
    assert not any(c in LUMI_RESERVED or topo.core_of[c] in LUMI_RESERVED for r in plan.ranks for c in r.cpus)


def test_dgx_plan_splits_shared_numa_cores_without_splitting_smt_pairs():
    gpus = parse_nvidia_topo(fixture("nvidia-smi-topo-dgx-a100-8gpu.txt"))
    core_of = {c: c % 128 for c in range(256)}  # 2 x 64 cores, sibling = core + 128
    topo = Topology(gpus=gpus, cpus=tuple(range(256)), core_of=core_of)
    plan = plan_binding(topo, 8)
    assert [r.cpulist for r in plan.ranks[:2]] == ["48-55,176-183", "56-63,184-191"]
    assert plan.ranks[4].cpulist == "112-119,240-247"
    every = [c for r in plan.ranks for c in r.cpus]
    # no overlap; the GPUs hang off 4 of the 8 NUMA nodes, whose 128 CPUs are all used
    assert len(every) == len(set(every)) == 128
    half = plan_binding(topo, 4)  # 4 ranks: GPUs 0-3, one per GPU, pairs still split
    assert [r.cpulist for r in half.ranks] == ["48-55,176-183", "56-63,184-191", "16-23,144-151", "24-31,152-159"]


def _dgx() -> Topology:
    gpus = parse_nvidia_topo(fixture("nvidia-smi-topo-dgx-a100-8gpu.txt"))
    return Topology(gpus=gpus, cpus=tuple(range(256)), core_of={c: c % 128 for c in range(256)})


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, (4, 5, 6, 7)),
        ({"CUDA_VISIBLE_DEVICES": "6, 2"}, (6, 2)),
        ({"CUDA_VISIBLE_DEVICES": "3,9,1"}, (3,)),  # CUDA stops at the first index that does not exist
        ({"CUDA_VISIBLE_DEVICES": ""}, ()),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, ()),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8a1b3c4d-0000-1111-2222-333344445555"}, None),  # a UUID: no index
        ({"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}, (5, 7)),  # HIP indexes ROCR's list
        ({"ROCR_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"}, (3,)),
    ],
)
def test_visible_gpus_in_the_order_torch_numbers_them(environ, expected):
    from trainscale.topology.plan import visible_gpus

    assert visible_gpus(environ, range(8)) == expected


def test_binding_follows_the_visible_gpus_not_the_physical_order():
    """CUDA_VISIBLE_DEVICES=4,5,6,7: local rank 0 drives cuda:0 = the node's GPU 4 (NUMA node 7, cores
    112-127), not GPU 0 (NUMA node 3) as the physical order would bind it."""
    from trainscale.topology.plan import gpu_order, visible_gpus

    topo = _dgx()
    order = gpu_order(visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, range(8)), range(8), 0, 4)
    plan = plan_binding(topo, 4, gpu_order=order)
    assert [r.gpu for r in plan.ranks] == [4, 5, 6, 7]
    assert [r.cpulist for r in plan.ranks] == ["112-119,240-247", "120-127,248-255", "80-87,208-215", "88-95,216-223"]
    with pytest.raises(ConfigError, match="4 local ranks but the node has 2 GPU.s. visible"):
        plan_binding(topo, 4, gpu_order=(4, 5))


def test_one_gpu_per_task_binds_this_rank_to_its_own_gpu():
    from trainscale.topology.plan import gpu_order

    order = gpu_order((6,), range(8), 2, 8)  # local rank 2 of 8 sees only GPU 6
    assert order[2] == 6 and sorted(order) == list(range(8))
    plan = plan_binding(_dgx(), 8, gpu_order=order)
    assert plan.ranks[2].gpu == 6 and set(plan.ranks[2].cpus) <= set(parse_cpulist("80-95,208-223"))


def test_a_visible_gpu_the_topology_does_not_know_is_refused():
    with pytest.raises(ConfigError, match="GPU.s. 9 are visible to this process but not in the node's topology"):
        plan_binding(_dgx(), 1, gpu_order=(9,))


def test_the_worker_plans_from_the_gpus_visible_to_it():
    from trainscale.topology import plan_from_env

    plan = plan_from_env("topology", 4, detect=_dgx, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert [r.gpu for r in plan.ranks] == [4, 5, 6, 7]


def test_4gpu_plan_without_smt_information_still_disjoint():
    gpus = parse_nvidia_topo(fixture("nvidia-smi-topo-hgx-a100-4gpu.txt"))
    plan = plan_binding(Topology(gpus=gpus, cpus=tuple(range(80))), 4)
    sets = [set(r.cpus) for r in plan.ranks]
    assert all(len(s) == 20 for s in sets) and len(set().union(*sets)) == 80
    assert sets[0] | sets[1] == set(parse_cpulist("0-19,40-59"))


def test_too_many_ranks_for_gpus():
    with pytest.raises(ConfigError, match="9 local ranks but the node has 8 GPU"):
        plan_binding(LUMI_MAP, 9)
    with pytest.raises(ConfigError, match="at least 1"):
        plan_binding(LUMI_MAP, 0)


def test_cpu_only_plan_splits_evenly():
    plan = plan_cpu_only(range(64), 8, reserved=LUMI_RESERVED)
    assert [r.cpulist for r in plan.ranks] == ["1-7", "9-15", "17-23", "25-31", "33-39", "41-47", "49-55", "57-63"]
    assert all(r.gpu is None for r in plan.ranks)
    uneven = plan_cpu_only("0-9", 3)
    assert [len(r.cpus) for r in uneven.ranks] == [4, 3, 3] and not uneven.shared
    tight = plan_binding({}, 4, cpus_per_node=2)
    assert tight.shared and [r.cpus for r in tight.ranks] == [(0,), (1,), (0,), (1,)]
    smt = plan_cpu_only(range(16), 2, core_of={c: c % 8 for c in range(16)})
    assert [r.cpulist for r in smt.ranks] == ["0-3,8-11", "4-7,12-15"]


def test_plan_env_round_trip():
    plan = plan_binding(LUMI_MAP, 8, reserved=LUMI_RESERVED)
    again = BindingPlan.from_env(plan.to_env())
    assert [(r.gpu, r.cpus) for r in again.ranks] == [(r.gpu, r.cpus) for r in plan.ranks]
    cpu = BindingPlan.from_env("-:0-1/-:2-3")
    assert [r.gpu for r in cpu.ranks] == [None, None] and cpu.ranks[1].cpus == (2, 3)
    assert [r.cpus for r in BindingPlan.from_env("0-1;2-3").ranks] == [(0, 1), (2, 3)]  # bare lists, ';'
    with pytest.raises(ConfigError, match="cannot read binding plan"):
        BindingPlan.from_env("0=1-3")


# --- detection ----------------------------------------------------------------------------------------------


def test_detect_prefers_nvidia_smi_and_notes_sources():
    text = fixture("nvidia-smi-topo-hgx-a100-4gpu.txt")
    topo = detect_topology(FIXTURES / "sysfs-2numa-smt", run=lambda argv: text if argv[0] == "nvidia-smi" else None)
    assert len(topo.gpus) == 4 and topo.sources[0] == "sysfs: 2 NUMA node(s)"
    assert any(s.startswith("nvidia-smi topo -m: 4") for s in topo.sources)


def test_detect_falls_back_to_sysfs_pci_when_tools_missing():
    topo = detect_topology(FIXTURES / "sysfs-2numa-smt", run=lambda argv: None)
    assert [format_cpulist(g.cpus) for g in topo.gpus] == ["0-3,8-11", "4-7,12-15"]
    assert "nvidia-smi: not available" in topo.sources and "rocm-smi: not available" in topo.sources
    plan = plan_binding(topo, 2)
    assert [r.cpulist for r in plan.ranks] == ["0-3,8-11", "4-7,12-15"]


def test_detect_survives_garbage_tool_output(tmp_path):
    topo = detect_topology(tmp_path, run=lambda argv: "NVIDIA-SMI has failed\n")
    assert topo.gpus == () and any("unreadable" in s for s in topo.sources)


def test_detect_this_machine_never_raises():
    topo = detect_topology()
    assert topo.cpus  # at least one CPU, whatever the machine
    plan = plan_binding(topo, 1)
    assert set(plan.ranks[0].cpus) <= set(topo.cpus)
