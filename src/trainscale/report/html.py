"""A page as one self-contained HTML file (its PNGs beside it and embedded in it), and the same in text.

The page checks itself when a browser opens it: a small script marks ``<body data-report="ok">`` once
every plot image has loaded, and records any script error in ``data-errors`` (the browser tests in
tests/integration/test_report.py read both).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from trainscale.report.pages import Page, Table
from trainscale.report.verdict import Finding

CHECK = """<script>
(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message || e)); });
  function done() {
    var imgs = Array.prototype.slice.call(document.querySelectorAll('img.plot'));
    var bad = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
    document.body.setAttribute('data-plots', String(imgs.length - bad.length));
    document.body.setAttribute('data-errors', errors.join(' | '));
    document.body.setAttribute('data-report', bad.length === 0 && errors.length === 0 ? 'ok' : 'broken');
  }
  if (document.readyState === 'complete') { done(); } else { window.addEventListener('load', done); }
})();
</script>"""
STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}"
    "h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}"
    "table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
    "td{white-space:nowrap}table.facts td{white-space:normal}"
    "table.facts th{text-align:left;background:#f4f4f4;white-space:nowrap}table.facts td{font-family:monospace}"
    "div.scroll{overflow-x:auto}li.problem{color:#b00}li.good{color:#070}li.note{color:#444}"
    "p.note{font-size:13px;color:#555;margin:.2em 0}p.missing{color:#a60}"
    "figure{margin:.8em 0 1.6em}img.plot{width:100%;height:auto;display:block}"
    "figcaption{font-size:13px;color:#555}"
)


def _verdict(found: list[Finding]) -> str:
    items = "".join(f'<li class="{f.level}">{html.escape(f.message)}</li>' for f in found)
    return f'<ul class="verdict">{items}</ul>' if items else ""


def _table(t: Table) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in t.head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in t.notes)
    return f'<div class="scroll"><table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table></div>{notes}'


def _image(caption: str, path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (
        f'<figure><img class="plot" alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)} ({html.escape(path.name)})</figcaption></figure>"
    )


def render_html(page: Page) -> str:
    facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in page.facts)
    parts = [
        f"<h1>trainscale report: {html.escape(page.title)}</h1>",
        f'<table class="facts">{facts}</table>',
        "<h2>Verdict</h2>",
        _verdict(page.verdict) or "<p>(nothing to say)</p>",
    ]
    for section in page.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts.append(_verdict(section.verdict))
        parts += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
        parts += [_table(t) for t in section.tables]
        parts += [_image(caption, path) for caption, path in section.images]
    parts += [f'<p class="missing">(no plots: {html.escape(m)})</p>' for m in page.missing]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>trainscale report: {html.escape(page.title)}"
        f"</title><style>{STYLE}</style></head><body>{''.join(parts)}{CHECK}</body></html>\n"
    )


def _text_table(t: Table) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in t.rows if i < len(r))) if t.rows else len(h) for i, h in enumerate(t.head)
    ]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (t.head, *t.rows)]
    return lines + list(t.notes)


def render_text(page: Page) -> str:
    width = max((len(k) for k, _ in page.facts), default=0)
    lines = [f"trainscale report: {page.title}", *(f"  {k.ljust(width)}  {v}" for k, v in page.facts), ""]
    lines += [f"[{f.level}] {f.message}" for f in page.verdict]
    for section in page.sections:
        lines += ["", f"== {section.title} =="]
        lines += [f"[{f.level}] {f.message}" for f in section.verdict]
        lines += section.paragraphs
        for t in section.tables:
            lines += _text_table(t)
        lines += [f"plot: {caption}: {path}" for caption, path in section.images]
    lines += [f"(no plots: {m})" for m in page.missing]
    return "\n".join(lines) + "\n"


def write_report(page: Page, out: Path) -> dict[str, Path]:
    """report.html (plots embedded) and report.txt into ``out``, where the page's plots were drawn."""
    out.mkdir(parents=True, exist_ok=True)
    html_path, text_path = out / "report.html", out / "report.txt"
    html_path.write_text(render_html(page))
    text_path.write_text(render_text(page))
    return {"html": html_path, "text": text_path}
