"""What the self-contained HTML pages share (``results/report.html``, ``results/report_2bw.html``): the style
sheet and figures with their PNG inlined as ``data:`` URIs, so a page needs no other file."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#222;
  max-width:1100px;margin:0 auto;padding:1.2em 1.5em 3em}
h1{font-size:1.55em;margin:.3em 0 .1em}
h2{font-size:1.2em;margin:2em 0 .6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.lede{color:#444;margin:.2em 0 1em}
.prov{display:grid;grid-template-columns:repeat(3,max-content 1fr);gap:2px 10px;background:#f6f8fa;
  border:1px solid #d8dee4;border-radius:6px;padding:8px 12px;font-size:12.5px}
.prov dt{color:#57606a}.prov dd{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace;overflow-wrap:anywhere}
.scroll{overflow-x:auto;margin:.5em 0}
table{border-collapse:collapse;font-size:13px}
th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;text-align:left;white-space:nowrap;vertical-align:top}
thead th{background:#f6f8fa;border-bottom:2px solid #d0d7de;font-weight:600}
thead tr.groups th{text-align:center;border-bottom:1px solid #d0d7de}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.g{border-left:2px solid #d0d7de}
td.same{color:#6e7781;font-style:italic;text-align:center}
.muted{color:#6e7781}
a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eaeef2}
figcaption{color:#57606a;font-size:13px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:0 16px}
h3{font-size:1.02em;margin:1.4em 0 .4em}
details{margin:.35em 0;padding:.3em .6em;border:1px solid #eaeef2;border-radius:6px}
summary{cursor:pointer}details ul{margin:.4em 0 .2em;padding-left:1.4em}details li{margin:.25em 0}
ul.notes li{margin:.3em 0}
code{font-family:ui-monospace,Menlo,Consolas,monospace;background:#f6f8fa;padding:0 3px;border-radius:3px}
"""


def data_uri(png: Path) -> str:
    """A PNG file as a ``data:`` URI, so the page carries its images."""
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def figure(png: Path, caption: str) -> str:
    """A ``<figure>`` with ``png`` inlined (:func:`data_uri`) and its caption."""
    return (f"<figure id='fig-{escape(png.stem)}'><img src='{data_uri(png)}' alt='{escape(caption)}'>"
            f"<figcaption>{escape(caption, quote=False)}</figcaption></figure>")
