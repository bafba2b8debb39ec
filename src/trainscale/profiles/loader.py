"""Find and read cluster profiles: built-in TOML files shipped in ``data/``, then the user's config directory.

A user profile with the same name as a built-in one replaces it. Files are data only (TOML), never code.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from trainscale.config import read_toml
from trainscale.errors import ConfigError, did_you_mean
from trainscale.profiles.schema import ClusterProfile, ContainerSpec
from trainscale.topology.cpulist import parse_cpulist

CONFIG_DIR_ENV = "TRAINSCALE_CONFIG_DIR"
_TUPLE_KEYS = ("partitions", "modules", "setup")
_SCALARS: dict[str, tuple[type, ...]] = {
    "description": (str,),
    "gpu_vendor": (str,),
    "binding": (str,),
    "default_launcher": (str,),
    "max_time": (str,),
    "gpus_per_node": (int,),
    "cpus_per_node": (int,),
    "mem_per_node_gb": (int, float),
    "mem_per_gpu_gb": (int, float),
    "forbid_cpus_per_gpu": (bool,),
    "requires_account": (bool,),
    "task_gpu": (str,),
    "extends": (str,),
    "shares_cores": (bool,),
    "interconnect": (str,),
    "interconnect_required": (bool,),
    "modules_checked": (str,),
}
MERGED_TABLES = ("env", "gpu_cores", "container")
"""With ``extends``, these tables merge key by key (the child's keys win); every other key the child
sets replaces the parent's value whole (lists included)."""


@dataclass(frozen=True, kw_only=True)
class ProfileSource:
    """Where one profile name comes from."""

    name: str
    """Profile name (the file name without ``.toml``)."""
    origin: str
    """``built-in`` or ``user``."""
    path: Path
    """The TOML file."""
    overrides_builtin: bool = False
    """True for a user profile that hides a built-in one of the same name."""


def user_profile_dir(environ: dict[str, str] | None = None) -> Path:
    """``$TRAINSCALE_CONFIG_DIR/profiles``, else ``$XDG_CONFIG_HOME/trainscale/profiles``, else ``~/.config/...``."""
    environ = os.environ if environ is None else environ
    if environ.get(CONFIG_DIR_ENV):
        return Path(environ[CONFIG_DIR_ENV]).expanduser() / "profiles"
    base = Path(environ["XDG_CONFIG_HOME"]) if environ.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "trainscale" / "profiles"


def builtin_profile_dir() -> Path:
    return Path(str(resources.files("trainscale.profiles") / "data"))


def list_profiles() -> list[ProfileSource]:
    """Every profile name available, sorted; a user file replaces the built-in file of the same name."""
    found: dict[str, ProfileSource] = {}
    for path in sorted(builtin_profile_dir().glob("*.toml")):
        found[path.stem] = ProfileSource(name=path.stem, origin="built-in", path=path)
    user_dir = user_profile_dir()
    if user_dir.is_dir():
        for path in sorted(user_dir.glob("*.toml")):
            found[path.stem] = ProfileSource(
                name=path.stem, origin="user", path=path, overrides_builtin=path.stem in found
            )
    return [found[name] for name in sorted(found)]


def load_profile(name_or_path: str | os.PathLike[str]) -> ClusterProfile:
    """A profile by name (user profiles win over built-ins) or from a ``.toml`` path."""
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        return profile_from_file(Path(text).expanduser())
    return profile_from_file(_source(text).path)


def _source(name: str, *, builtin_only: bool = False) -> ProfileSource:
    known = {s.name: s for s in list_profiles()}
    sources = known
    if builtin_only:
        path = builtin_profile_dir() / f"{name}.toml"
        sources = {name: ProfileSource(name=name, origin="built-in", path=path)} if path.is_file() else {}
    if name not in sources:
        raise ConfigError(
            f"unknown cluster profile {name!r}",
            hint=f"{did_you_mean(name, list(known))}; `trainscale profiles` lists them, and you can "
            f"add your own as {user_profile_dir() / (name + '.toml')}",
        )
    return sources[name]


def merge_profile_data(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` over ``parent`` by the rule of :data:`MERGED_TABLES`."""
    merged = dict(parent)
    for key, value in child.items():
        if key in MERGED_TABLES and isinstance(value, dict) and isinstance(parent.get(key), dict):
            merged[key] = {**parent[key], **value}
        else:
            merged[key] = value
    merged.pop("name", None)
    return merged


def _resolved_data(path: Path, chain: tuple[str, ...] = ()) -> dict[str, Any]:
    """The file's table with its ``extends`` chain merged in (parents first)."""
    data = read_toml(path, "profile file", "give a profile name or a path to a .toml file", "check quotes and brackets")
    parent_name = data.get("extends")
    if parent_name is None:
        return data
    if not isinstance(parent_name, str) or not parent_name:
        raise ConfigError(f"{path}: extends = {parent_name!r} should name a profile", hint='e.g. extends = "lumi"')
    if parent_name in chain:
        raise ConfigError(
            f"{path}: extends = {parent_name!r} makes a cycle ({' -> '.join(chain + (parent_name,))})",
            hint="a profile cannot extend itself, directly or through others",
        )
    # A user profile that extends its own name (lumi.toml: extends = "lumi") means the built-in one.
    source = _source(parent_name, builtin_only=parent_name == path.stem)
    parent = _resolved_data(source.path, chain + (path.stem,))
    return {**merge_profile_data(parent, data), "extends": parent_name}


def profile_from_file(path: Path) -> ClusterProfile:
    """A profile file, with the profile it ``extends`` (if any) merged under it."""
    return profile_from_dict(_resolved_data(Path(path)), name=Path(path).stem, origin=str(path))


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _check_keys(data: dict[str, Any], valid: list[str], origin: str, where: str = "") -> None:
    for key in data:
        if key not in valid:
            raise ConfigError(f"{origin}: unknown key {where}{key!r}", hint=did_you_mean(key, valid))


def _cores(value: Any, origin: str, key: str) -> tuple[int, ...]:
    try:
        return parse_cpulist(value)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {key}: {exc.message}", hint=exc.hint) from None


def profile_from_dict(data: dict[str, Any], *, name: str, origin: str = "<dict>") -> ClusterProfile:
    """Validate a parsed TOML table into a :class:`ClusterProfile` (every key checked, core lists parsed)."""
    _check_keys(data, _fields(ClusterProfile), origin)
    if data.get("name", name) != name:
        raise ConfigError(
            f"{origin}: name = {data['name']!r} but the file is named {name!r}.toml",
            hint="rename the file or drop the name key: a profile is named after its file",
        )
    values = {k: v for k, v in data.items() if k != "name"}
    if isinstance(values.get("modules_checked"), datetime.date):  # TOML's bare date: modules_checked = 2026-11-24
        values["modules_checked"] = values["modules_checked"].isoformat()
    for key, types in _SCALARS.items():
        value = values.get(key)
        if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            expected = " or ".join(t.__name__ for t in types)
            raise ConfigError(
                f"{origin}: {key} = {value!r} should be {expected}", hint="see docs/profiles.md for each key"
            )
    for key in _TUPLE_KEYS:
        if key in values:
            if not isinstance(values[key], list) or not all(isinstance(x, str) for x in values[key]):
                raise ConfigError(f"{origin}: {key} must be a list of strings", hint=f'e.g. {key} = ["..."]')
            values[key] = tuple(values[key])
    if "reserved_cores" in values:
        values["reserved_cores"] = _cores(values["reserved_cores"], origin, "reserved_cores")
    if "gpu_cores" in values:
        table = values["gpu_cores"]
        if not isinstance(table, dict):
            raise ConfigError(
                f"{origin}: gpu_cores must be a table of GPU index -> core list",
                hint='e.g. gpu_cores = { 0 = "49-55", 1 = "57-63" }',
            )
        cores = {}
        for gpu, value in table.items():
            if not str(gpu).isdigit():
                raise ConfigError(f"{origin}: gpu_cores key {gpu!r} is not a GPU index", hint="keys are 0, 1, 2, ...")
            cores[int(gpu)] = _cores(value, origin, f"gpu_cores.{gpu}")
        values["gpu_cores"] = cores
    if "env" in values:
        if not isinstance(values["env"], dict) or not all(isinstance(v, str) for v in values["env"].values()):
            raise ConfigError(
                f"{origin}: env must be a table of strings", hint='e.g. [env] NCCL_SOCKET_IFNAME = "hsn0"'
            )
        values["env"] = dict(values["env"])
    if "container" in values:
        table = values["container"]
        if not isinstance(table, dict):
            raise ConfigError(f"{origin}: container must be a table", hint='[container] runtime = "singularity"')
        _check_keys(table, _fields(ContainerSpec), origin, "container.")
        for key in ("binds", "flags", "setup", "modules"):
            if key in table and (not isinstance(table[key], list) or not all(isinstance(x, str) for x in table[key])):
                raise ConfigError(f"{origin}: container.{key} must be a list of strings", hint=f'e.g. {key} = ["..."]')
        values["container"] = ContainerSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()})
    try:
        return ClusterProfile(name=name, **values)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc.message}", hint=exc.hint) from None
    except TypeError as exc:  # a value of the wrong type reaching a comparison in __post_init__
        raise ConfigError(
            f"{origin}: a value has the wrong type ({exc})", hint="see docs/profiles.md for each key"
        ) from None
