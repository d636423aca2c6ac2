"""``results/report.html``: Table 1 and every plot on one page."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd


def html_report(table: pd.DataFrame, notes: list[str], results: Path) -> str:
    """A self-contained page: Table 1, its notes, and every PNG under ``results/plots`` (relative links)."""
    images = sorted((results / "plots").glob("*.png"))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>pipedream-repro: Table 1</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}img{max-width:900px;display:block;margin:1em 0}"
        "</style></head><body><h1>Table 1: PipeDream vs data parallelism</h1>",
        table.to_html(index=False, na_rep="—", float_format=lambda v: f"{v:.3g}"),
        "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>",
    ]
    for img in images:
        rel = img.relative_to(results).as_posix()
        parts.append(f"<h3>{html.escape(img.stem)}</h3><img src='{html.escape(rel)}' alt='{html.escape(img.stem)}'>")
    parts.append("</body></html>")
    return "\n".join(parts)
