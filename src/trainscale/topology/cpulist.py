"""CPU sets in the two spellings tools use: Linux cpulists ("0-3,8-11") and SLURM ``mask_cpu`` hex masks."""

from __future__ import annotations

from collections.abc import Iterable

from trainscale.errors import ConfigError


def parse_cpulist(text: str | Iterable[int]) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``; sorted, without duplicates. A list of ints passes through."""
    if not isinstance(text, str):
        cores = list(text)
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in cores):
            raise ConfigError(f"core list {cores!r} must hold non-negative integers", hint='e.g. [1, 2, 3] or "1-3"')
        return tuple(sorted(set(cores)))
    cores: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            start = int(lo)
            end = int(hi) if sep else start
        except ValueError:
            raise ConfigError(
                f"cannot read core list {text!r}: {part!r} is not a core number or a range",
                hint='write core lists like "49-55" or "1-7,9-15"',
            ) from None
        if start < 0 or end < start:
            raise ConfigError(
                f"cannot read core list {text!r}: range {part!r} is empty or negative",
                hint='ranges go from low to high, e.g. "1-7"',
            )
        cores.update(range(start, end + 1))
    return tuple(sorted(cores))


def format_cpulist(cores: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"``: the compact form sysfs and taskset use."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive cores
    for core in sorted(set(cores)):
        if runs and runs[-1][1] == core - 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def cores_to_mask(cores: Iterable[int]) -> str:
    """Core set -> SLURM ``mask_cpu`` hex, bit N for core N: cores 49-55 -> ``0xfe000000000000``."""
    value = 0
    for core in cores:
        if core < 0:
            raise ConfigError(f"core {core} is negative", hint="core numbers start at 0")
        value |= 1 << core
    if value == 0:
        raise ConfigError("cannot build a mask_cpu from an empty core set", hint="give each rank at least one core")
    return hex(value)


def mask_to_cores(mask: str) -> tuple[int, ...]:
    """SLURM ``mask_cpu`` hex (with or without ``0x``) -> sorted core tuple."""
    text = mask.strip().lower()
    try:
        value = int(text[2:] if text.startswith("0x") else text, 16)
    except ValueError:
        raise ConfigError(f"{mask!r} is not a hex CPU mask", hint="masks look like 0xfe000000000000") from None
    return tuple(bit for bit in range(value.bit_length()) if value >> bit & 1)
