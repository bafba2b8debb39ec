"""The live console view of a study: one row per run, updated from rank 0's output as it arrives.

The launcher tees rank 0's output to ``sys.stdout``/``sys.stderr``; while a run is live those are
replaced by a sink that reads each line (epoch done, loss) into the table instead of the console.
With ``verbose`` the lines are printed above the table as well.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table

_EPOCH = re.compile(r"Epoch (\d+): loss ([0-9.]+).*?accuracy ([0-9.]+%)")
_PREFIX = re.compile(r"^\[rank\d+\]:\s?")


@dataclass
class Row:
    name: str
    label: str
    ranks: int
    batch: int
    epochs: int | None
    status: str = "pending"
    epoch: int = 0
    detail: str = ""
    started: float | None = None
    ended: float | None = None

    @property
    def elapsed(self) -> str:
        if self.started is None:
            return ""
        return f"{(self.ended or time.monotonic()) - self.started:.1f}s"


class _LineSink(io.TextIOBase):
    def __init__(self, on_line) -> None:
        self.on_line = on_line
        self.partial = ""

    def write(self, text: str) -> int:
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self.on_line(line)
        return len(text)


class StudyDisplay:
    """A rich Live table when the console is a terminal; plain one-line updates otherwise."""

    def __init__(self, title: str, rows: list[Row], verbose: bool = False, console=None) -> None:
        self.title = title
        self.rows = {r.name: r for r in rows}
        self.verbose = verbose
        self.console = console or Console(file=sys.stdout)
        self.live = None

    def _table(self):
        table = Table(title=self.title, expand=False)
        for col in ("Run", "Version", "Ranks", "Batch/rank", "Status", "Epoch", "Elapsed", "Last"):
            table.add_column(col)
        colours = {"running": "yellow", "ok": "green", "failed": "red", "pending": "dim"}
        for r in self.rows.values():
            epoch = f"{r.epoch}/{r.epochs}" if r.epochs else (str(r.epoch) if r.epoch else "")
            table.add_row(
                r.name,
                r.label,
                str(r.ranks),
                str(r.batch),
                f"[{colours.get(r.status, 'white')}]{r.status}[/]",
                epoch,
                r.elapsed,
                r.detail[-60:],
            )
        return table

    def __enter__(self) -> StudyDisplay:
        if self.console.is_terminal:
            self.live = Live(
                self._table(),
                console=self.console,
                refresh_per_second=4,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.__exit__(*exc)
        else:
            self.console.print(self._table())

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._table())

    def start(self, name: str) -> None:
        row = self.rows[name]
        row.status, row.started = "running", time.monotonic()
        if self.live is None:
            self.console.print(f"bench: {row.name} {row.label}, {row.ranks} rank(s), batch {row.batch} per rank ...")
        self._refresh()

    def finish(self, name: str, ok: bool, detail: str = "") -> None:
        row = self.rows[name]
        row.status, row.ended = ("ok" if ok else "failed"), time.monotonic()
        if ok and row.epochs:  # a SLURM job's epoch lines go to its own log, not through this display
            row.epoch = row.epochs
        if detail:
            row.detail = detail
        if self.live is None:
            self.console.print(f"bench: {row.name} {row.status} in {row.elapsed} {row.detail}")
        self._refresh()

    def line(self, name: str, text: str) -> None:
        text = _PREFIX.sub("", text.rstrip())
        if not text:
            return
        row = self.rows[name]
        match = _EPOCH.search(text)
        if match:
            row.epoch = int(match.group(1))
            row.detail = f"loss {match.group(2)}, accuracy {match.group(3)}"
        elif not row.epoch and not text.startswith("trainscale: set"):
            row.detail = text  # what the run is doing until its first epoch ends; then the epoch's loss stays
            # (the memory table and the launcher's closing lines that follow are not the run's last word)
        if self.verbose:
            self.console.print(f"[dim]{name}[/] {text}", markup=True, highlight=False)
        self._refresh()

    @contextlib.contextmanager
    def capture(self, name: str) -> Iterator[None]:
        """Route what the launcher writes to stdout/stderr during one run into this display."""
        sink = _LineSink(lambda text: self.line(name, text))
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = sink
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved
            if sink.partial:
                self.line(name, sink.partial)
