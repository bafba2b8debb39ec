"""`trainscale doctor --nproc N`: the doctor on N ranks started by trainscale's launcher, one report from them."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from trainscale.doctor.render import Report
from trainscale.launch.local import LocalLaunchSpec, launch


def merge(files: list[Path]) -> Report:
    """Rank 0's report, plus the network findings of ranks that could not gather theirs to rank 0."""
    reports = [Report.from_dict(json.loads(p.read_text())) for p in files]
    main, rest = reports[0], reports[1:]
    extra = tuple(f for r in rest for f in r.findings if f.rank is not None)
    ranks = max(main.ranks_reporting, len({f.rank for f in main.findings + extra if f.rank is not None}))
    return Report(
        host=main.host,
        created=main.created,
        command=main.command,
        findings=main.findings + extra,
        ranks_reporting=ranks,
    )


def launched_report(nproc: int, args: list[str], log_dir: Path | None):
    """(the merged report or None when the ranks wrote none, the launch's result); the ranks' logs go to
    ``log_dir`` (default: a temporary directory)."""
    with tempfile.TemporaryDirectory(prefix="trainscale-doctor-") as tmp:
        output = Path(tmp) / "report.json"
        spec = LocalLaunchSpec(
            target="trainscale.doctor",
            module=True,
            nproc_per_node=nproc,
            args=(*args, "--output", str(output)),
            log_dir=log_dir or Path(tmp) / "logs",
        )
        result = launch(spec)
        files = sorted(Path(tmp).glob("report.json.rank*"), key=lambda p: int(p.name.rpartition("rank")[2]))
        if not output.exists():
            return None, result
        return merge([output, *files]), result
