"""Cluster profiles: built-ins, user overrides, every loading error, binding helpers and the CLI."""

from __future__ import annotations

import pytest

from trainscale.cli.main import main
from trainscale.errors import ConfigError
from trainscale.profiles import (
    binding_plan,
    list_profiles,
    load_profile,
    profile_from_dict,
    slurm_cpu_bind,
    worker_bind_env,
)
from trainscale.profiles.loader import builtin_profile_dir
from trainscale.topology import PLAN_ENV, BindingPlan, format_cpulist

LUMI_MASKS = "0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00,0xfe00000000,0xfe0000000000"
BUILTINS = {"local-test", "lumi", "cyclone", "generic-nvidia", "generic-nvidia-pyxis"}


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch):
    """Every test gets an empty user profile directory (never the developer's own ~/.config)."""
    monkeypatch.setenv("TRAINSCALE_CONFIG_DIR", str(tmp_path))
    directory = tmp_path / "profiles"
    directory.mkdir()
    return directory


def test_builtins_listed_and_loadable():
    sources = list_profiles()
    assert {s.name for s in sources} == BUILTINS
    assert all(s.origin == "built-in" and not s.overrides_builtin for s in sources)
    for s in sources:
        assert load_profile(s.name).name == s.name


def test_lumi_profile_facts():
    lumi = load_profile("lumi")
    assert lumi.partitions == ("standard-g", "small-g") and lumi.default_partition == "standard-g"
    assert lumi.gpus_per_node == 8 and lumi.gpu_vendor == "amd" and lumi.binding == "map"
    assert {g: format_cpulist(c) for g, c in lumi.gpu_cores.items()} == {
        0: "49-55",
        1: "57-63",
        2: "17-23",
        3: "25-31",
        4: "1-7",
        5: "9-15",
        6: "33-39",
        7: "41-47",
    }
    assert lumi.reserved_cores == (0, 8, 16, 24, 32, 40, 48, 56)
    usable = {c for cores in lumi.gpu_cores.values() for c in cores}
    assert len(usable) == 56 and not usable & set(lumi.reserved_cores)
    assert lumi.mem_per_gpu_gb == 60 and lumi.forbid_cpus_per_gpu and lumi.requires_account
    assert lumi.env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3" and lumi.env["NCCL_NET_GDR_LEVEL"] == "PHB"
    assert "MIOPEN_USER_DB_PATH" in lumi.env
    assert any("module load LUMI/" in m for m in lumi.modules)
    assert lumi.container is not None and lumi.container.runtime == "singularity" and lumi.container.binds


def test_other_builtins():
    local = load_profile("local-test")
    assert (
        local.partitions,
        local.cpus_per_node,
        local.gpus_per_node,
        local.gpu_vendor,
        local.binding,
        local.default_launcher,
        local.backend,
    ) == (("debug",), 4, 0, "none", "none", "torchrun", "gloo")
    cyclone = load_profile("cyclone")
    assert (cyclone.partitions, cyclone.gpus_per_node, cyclone.cpus_per_node, cyclone.binding) == (
        ("gpu",),
        4,
        40,
        "topology",
    )
    assert load_profile("generic-nvidia").binding == "topology"


def test_slurm_and_worker_binding_for_lumi():
    lumi = load_profile("lumi")
    assert slurm_cpu_bind(lumi, 8) == f"--cpu-bind=mask_cpu:{LUMI_MASKS}"
    assert slurm_cpu_bind(lumi, 2) == "--cpu-bind=mask_cpu:0xfe000000000000,0xfe00000000000000"
    env = worker_bind_env(lumi, 8)
    assert BindingPlan.from_env(env[PLAN_ENV]).mask_list() == LUMI_MASKS
    assert binding_plan(lumi, 8).mask_list() == LUMI_MASKS


def test_binding_helpers_for_topology_and_none_profiles():
    cyclone = load_profile("cyclone")
    assert slurm_cpu_bind(cyclone, 4) == "--cpu-bind=none"
    assert worker_bind_env(cyclone, 4) == {PLAN_ENV: "topology"}
    assert binding_plan(cyclone, 4) is None  # needs the node's topology
    local = load_profile("local-test")
    assert slurm_cpu_bind(local, 2) == "--cpu-bind=none"  # its nodes share one machine's cores
    assert worker_bind_env(local, 2) == {} and binding_plan(local, 2) is None


def test_unknown_profile_lists_valid_ones():
    with pytest.raises(ConfigError) as err:
        load_profile("lumu")
    text = str(err.value)
    assert "unknown cluster profile 'lumu'" in text and "did you mean 'lumi'" in text
    assert all(name in text for name in BUILTINS)


def write(directory, name, text):
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_key_and_valid_keys(user_dir):
    path = write(user_dir, "mine", "gpus_per_nod = 4\n")
    with pytest.raises(ConfigError) as err:
        load_profile("mine")
    text = str(err.value)
    assert str(path) in text and "'gpus_per_nod'" in text and "did you mean 'gpus_per_node'" in text
    assert "cpus_per_node" in text  # the valid keys are listed
    write(user_dir, "box", '[container]\nimage = "x.sif"\n')
    with pytest.raises(ConfigError, match=r"unknown key container\.'image'"):
        load_profile("box")


@pytest.mark.parametrize(
    "body, message",
    [
        ('binding = "map"\ngpus_per_node = 1\n[gpu_cores]\n0 = "1-x"\n', "gpu_cores.0: cannot read core list"),
        ('reserved_cores = "8-1"\n', "reserved_cores: cannot read core list"),
        ('binding = "map"\ngpus_per_node = 2\n[gpu_cores]\n0 = "1-7"\n', r"no entry for GPU\(s\) \[1\]"),
        ('gpus_per_node = "4"\n', "gpus_per_node = '4' should be int"),
        ('requires_account = "yes"\n', "should be bool"),
        ('gpu_vendor = "intel"\n', "gpu_vendor 'intel' unknown"),
        ('partitions = "gpu"\n', "partitions must be a list of strings"),
        ('name = "other"\n', "the file is named 'bad'.toml"),
        ("gpus_per_node = \n", "not valid TOML"),
        ('[gpu_cores]\nfirst = "1-3"\n', "not a GPU index"),
        ('interconnect = "myrinet"\n', "interconnect 'myrinet' unknown"),
    ],
)
def test_bad_files_are_explained(user_dir, body, message):
    path = write(user_dir, "bad", body)
    with pytest.raises(ConfigError, match=message) as err:
        load_profile("bad")
    assert str(path) in str(err.value)


def test_core_lists_accept_strings_and_arrays():
    profile = profile_from_dict(
        {"gpus_per_node": 2, "binding": "map", "reserved_cores": [0, 8], "gpu_cores": {"0": "1-7", "1": [9, 10, 11]}},
        name="x",
    )
    assert profile.gpu_cores == {0: tuple(range(1, 8)), 1: (9, 10, 11)} and profile.reserved_cores == (0, 8)


def test_user_profile_overrides_builtin_and_adds_new(user_dir):
    write(user_dir, "lumi", 'description = "my LUMI"\ngpus_per_node = 4\npartitions = ["dev-g"]\n')
    write(user_dir, "home", 'description = "home box"\ncpus_per_node = 8\n')
    sources = {s.name: s for s in list_profiles()}
    assert sources["lumi"].origin == "user" and sources["lumi"].overrides_builtin
    assert sources["home"].origin == "user" and not sources["home"].overrides_builtin
    assert sources["cyclone"].origin == "built-in"
    lumi = load_profile("lumi")
    assert lumi.description == "my LUMI" and lumi.partitions == ("dev-g",) and lumi.gpu_cores == {}
    assert load_profile("home").cpus_per_node == 8


def test_load_by_path(tmp_path):
    path = write(tmp_path, "elsewhere", 'gpus_per_node = 2\ngpu_vendor = "nvidia"\n')
    assert load_profile(str(path)).gpus_per_node == 2
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile(str(tmp_path / "missing.toml"))


def test_default_user_dir_is_under_config_home(monkeypatch, tmp_path):
    from trainscale.profiles import user_profile_dir

    assert user_profile_dir({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "trainscale" / "profiles"
    assert user_profile_dir({"TRAINSCALE_CONFIG_DIR": "/etc/ts"}).as_posix() == "/etc/ts/profiles"


# --- CLI ----------------------------------------------------------------------------------------------------


def test_cli_profiles_table(capsys, user_dir):
    write(user_dir, "lumi", 'description = "my LUMI"\n')
    write(user_dir, "broken", "gpus_per_nod = 1\n")
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    lines = {
        line.split()[0]: line
        for line in out.splitlines()
        if line and not line.startswith(("NAME", "User", "One profile"))
    }
    assert set(lines) == BUILTINS | {"broken"}
    assert "built-in" in lines["cyclone"] and "gpu" in lines["cyclone"] and " 4 " in lines["cyclone"]
    assert "replaces built-in" in lines["lumi"] and "my LUMI" in lines["lumi"]
    assert "BROKEN" in lines["broken"] and "gpus_per_nod" in lines["broken"]
    assert "debug" in lines["local-test"] and "torchrun" in lines["local-test"]


def test_cli_profiles_show_one(capsys):
    assert main(["profiles", "lumi"]) == 0
    out = capsys.readouterr().out
    assert "0:49-55 1:57-63" in out and "reserved_cores       0,8,16,24,32,40,48,56" in out


def test_cli_profile_binding_lumi(capsys):
    assert main(["profiles", "lumi"]) == 0
    out = capsys.readouterr().out
    assert f"--cpu-bind=mask_cpu:{LUMI_MASKS}" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert rows == [
        [str(r), str(r), cores, mask]
        for r, (cores, mask) in enumerate(
            zip(["49-55", "57-63", "17-23", "25-31", "1-7", "9-15", "33-39", "41-47"], LUMI_MASKS.split(","))
        )
    ]


def test_cli_profile_binding_lumi_fewer_ranks(capsys):
    assert main(["profiles", "lumi", "--ranks", "2"]) == 0
    assert "--cpu-bind=mask_cpu:0xfe000000000000,0xfe00000000000000\n" in capsys.readouterr().out


def test_cli_profile_binding_detected_and_errors(capsys):
    assert main(["profiles", "--here", "--ranks", "1"]) == 0
    out = capsys.readouterr().out
    assert "Detected topology" in out and "--cpu-bind=mask_cpu:0x" in out
    assert (
        main(["profiles", "lumi", "--here"]) == 2 and "a profile (lumi) and --here together" in capsys.readouterr().err
    )
    assert main(["profiles", "lumi", "--reserved", "0"]) == 2
    assert "--reserved applies to this machine's plan" in capsys.readouterr().err
    assert main(["profiles", "--ranks", "2"]) == 2 and "name a profile, or --here" in capsys.readouterr().err
    assert main(["profiles", "lumi", "--ranks", "9"]) == 2
    assert "9 local ranks but the node has 8 GPU" in capsys.readouterr().err
    assert main(["profiles", "nope"]) == 2
    assert "unknown cluster profile 'nope'" in capsys.readouterr().err
    assert main(["profiles", "local-test"]) == 0
    assert 'Binding: "none": trainscale leaves CPU affinity' in capsys.readouterr().out


def test_user_profile_extends_a_builtin_and_changes_only_what_it_sets(user_dir, capsys):
    # A LUMI user's own lumi.toml: the built-in facts stay, the module lines and one variable change.
    write(
        user_dir,
        "lumi",
        'extends = "lumi"\n'
        'modules = ["module use /appl/local/containers/ai-modules", "module load singularity-AI-bindings"]\n'
        '[env]\nHF_HOME = "/flash/project_465000000/hf"\n'
        '[container]\nbinds = ["/flash"]\n',
    )
    mine, builtin = load_profile("lumi"), load_profile(str(builtin_profile_dir() / "lumi.toml"))
    assert mine.extends == "lumi" and builtin.extends == ""
    assert mine.modules == ("module use /appl/local/containers/ai-modules", "module load singularity-AI-bindings")
    assert mine.gpu_cores == builtin.gpu_cores and mine.reserved_cores == builtin.reserved_cores  # kept
    assert mine.env["HF_HOME"] == "/flash/project_465000000/hf"  # tables merge key by key, the child's win
    assert mine.env["NCCL_SOCKET_IFNAME"] == builtin.env["NCCL_SOCKET_IFNAME"]
    assert mine.container.binds == ("/flash",) and mine.container.runtime == "singularity"  # a list is replaced
    write(user_dir, "lumi-ai", 'extends = "lumi"\ndescription = "LUMI with the AI bindings"\n')
    assert load_profile("lumi-ai").modules == mine.modules  # extends the user's lumi, which extends the built-in
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "(extends lumi)" in out


def test_extends_errors_name_the_file_and_the_fix(user_dir):
    write(user_dir, "a", 'extends = "b"\n')
    write(user_dir, "b", 'extends = "a"\n')
    with pytest.raises(ConfigError, match="makes a cycle"):
        load_profile("a")
    write(user_dir, "c", 'extends = "lumii"\n')
    with pytest.raises(ConfigError, match="unknown cluster profile 'lumii'") as err:
        load_profile("c")
    assert "lumi" in err.value.hint
    write(user_dir, "d", 'extends = "lumi"\ntask_gpu = "cgroups"\n')
    with pytest.raises(ConfigError, match="task_gpu 'cgroups' unknown"):
        load_profile("d")
