"""Where a report came from: the code's commit, the config and its key settings, the machine that built it."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from pipedream.sim.cores import host_cores

CHECKOUT = Path(__file__).resolve().parents[2]  # the code that builds the report


def _git(*args: str) -> str | None:
    """``git ARGS`` in the package's checkout (5 s limit); None without git or outside a checkout."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, check=True, cwd=CHECKOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def git_state() -> str:
    """The short HEAD commit, with ``" (dirty)"`` if tracked files changed; ``"unknown"`` outside git."""
    head = _git("rev-parse", "--short", "HEAD")
    if head is None:
        return "unknown"
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return head.strip() + (" (dirty)" if changes else "")


def _device() -> tuple[str, str]:
    """(torch version, CUDA device name or "none")."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed", "none"
    import torch

    if torch.cuda.is_available():
        return version, f"{torch.cuda.get_device_name(0)} (x{torch.cuda.device_count()})"
    return version, "none"


def _bandwidth(bps: Any) -> str:
    """``emulate_bandwidth_Bps`` in words: ``"1 Gbps (1.25e+08 B/s)"``, or ``"none"``."""
    if not bps:
        return "none (links at full speed)"
    return f"{float(bps) * 8 / 1e9:.3g} Gbps ({float(bps):.3g} B/s)"


def _workers(workers: int | None, cpus: int | None) -> str:
    """Worker processes (one thread each: ``pipedream train`` sets OMP_NUM_THREADS=1) and, when they
    outnumber the cores, by how much: timings of oversubscribed runs are shown as such, not hidden."""
    if not workers:
        return "unknown"
    text = f"{workers} processes, 1 thread each"
    if cpus and workers > cpus:
        text += f" ({workers / cpus:.1f}x oversubscribed on {cpus} cores: epoch times are pessimistic)"
    return text


def collect(cfg: dict[str, Any], config_path: str | None) -> dict[str, str]:
    """The report's provenance as label -> text, in display order.

    Args:
        cfg: the experiment config the report was built from.
        config_path: its file (``pipedream report --config``), if known.
    """
    torch_version, cuda = _device()
    return {"commit": git_state(), "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "config": config_path or "unknown", "scale": str(cfg.get("scale", "unknown")),
            "workers": _workers(cfg.get("workers"), host_cores()), "cluster": str(cfg.get("cluster", "unknown")),
            "emulated bandwidth": _bandwidth(cfg.get("emulate_bandwidth_Bps")), "host": platform.node() or "unknown",
            "CPUs": str(host_cores()), "torch": torch_version, "CUDA device": cuda}
