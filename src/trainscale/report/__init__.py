"""`trainscale report`: one page on what ran and how efficiently, for a run, a study, a sweep or a SLURM job
(sources -> gather -> verdict -> pages -> HTML)."""

from trainscale.report.gather import Gathered
from trainscale.report.html import render_html, render_text, write_report
from trainscale.report.pages import Page, build

__all__ = ["Gathered", "Page", "build", "render_html", "render_text", "write_report"]
