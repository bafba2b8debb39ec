"""`trainscale report`: one page on how efficient a run or job was, and why (gather -> verdict -> HTML)."""

from trainscale.report.gather import Gathered, gather
from trainscale.report.html import render_text, write_report

__all__ = ["Gathered", "gather", "render_text", "write_report"]
