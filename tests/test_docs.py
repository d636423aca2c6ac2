"""The README and the pages of docs/ run as written, and the references name everything they document.

Code blocks (read with mktestdocs): every ``python`` block of a page runs in page order in a fresh folder, and a
block whose first line is ``# name.py`` is also saved under that name; then every ``bash`` block runs there
(``bash -e -u``); ``sh`` blocks are shown, not run; ``yaml`` blocks must parse. The blocks use tiny models and
shipped profiles, so a page takes seconds. A ``yaml`` block that is a whole experiment config must
validate against the schema.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from mktestdocs import check_md_file, grab_code_blocks

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
RUNS = ("python", "bash", "yaml")


def _blocks(page: Path, lang: str) -> list[str]:
    return [str(b) for b in grab_code_blocks(page.read_text(), lang=lang)]


RUNNABLE = [p for p in PAGES if any(_blocks(p, lang) for lang in RUNS)]


@pytest.mark.slow  # the README's Python example trains on 2 forked workers
@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_the_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    monkeypatch.setenv("PIPEDREAM_TRACKING", "off")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for block in _blocks(page, "python"):
        name = re.fullmatch(r"# (\w+\.py)", block.splitlines()[0].strip())
        if name:
            (tmp_path / name.group(1)).write_text(block)
    check_md_file(page, lang="python")  # each block on its own, as __main__
    check_md_file(page, lang="bash")
    for block in _blocks(page, "yaml"):
        doc = yaml.safe_load(block)
        assert isinstance(doc, dict), block
        if "scale" in doc:  # a whole experiment config: valid as `pipedream check` reads it
            jsonschema.validate(doc, yaml.safe_load((REPO / "workflows/schemas/config.schema.yaml").read_text()))


def test_the_readme_is_one_short_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250 and len(text.encode()) <= 20 * 1024


def test_every_docs_page_is_in_the_site_and_a_few_hundred_lines_at_most() -> None:
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    in_nav = {page for entry in nav for page in entry.values()}
    assert in_nav == {p.name for p in DOCS.glob("*.md")}
    for page in DOCS.glob("*.md"):
        assert len(page.read_text().splitlines()) <= 300, page.name


def test_the_readmes_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (REPO / target).exists(), target


def test_the_readmes_layout_names_every_module() -> None:
    text = README.read_text()
    layout = text[text.index("## Layout"):text.index("\n## ", text.index("## Layout") + 1)]
    package = REPO / "pipedream"
    names = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    names += [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = [n for n in names if not re.search(rf"(?<![\w/]){re.escape(n)}", layout)]
    assert not missing, f"README's Layout omits {missing}"


def _schema_keys(schema: dict[str, Any], prefix: str = "", parent: str = "") -> list[str]:
    """Every key a config may hold, as a dotted path: ``launch.nnodes``, ``models.<model>.train.lr``,
    ``models.<model>.paper_rows[].servers`` (a mapping of names is ``<name>`` after the singular of its key)."""
    keys: list[str] = []
    for key, sub in schema.get("properties", {}).items():
        keys.append(prefix + key)
        keys += _schema_keys(sub, f"{prefix}{key}.", key)
    if isinstance(schema.get("additionalProperties"), dict):
        name = f"<{parent.removesuffix('s')}>"
        keys.append(prefix + name)
        keys += _schema_keys(schema["additionalProperties"], f"{prefix}{name}.", name)
    items = schema.get("items")
    if isinstance(items, dict):
        item_keys = list(items.get("properties", {})) or list(items.get("required", []))
        keys += [f"{prefix.removesuffix('.')}[].{k}" for k in item_keys]
        for key, sub in items.get("properties", {}).items():
            keys += _schema_keys(sub, f"{prefix.removesuffix('.')}[].{key}.", key)
    return keys


def test_the_configuration_reference_names_every_schema_key() -> None:
    page = (DOCS / "configuration.md").read_text()
    keys = []
    for path in sorted((REPO / "workflows" / "schemas").glob("*")):
        keys += _schema_keys(yaml.safe_load(path.read_text()))
    assert "models.<model>.train.lr" in keys and "launch.nnodes" in keys and len(keys) > 50
    missing = [k for k in keys if f"`{k}`" not in page]
    assert not missing, f"docs/configuration.md does not name {missing}"


def test_the_command_line_reference_names_every_option() -> None:
    from pipedream.cli import build_parser

    page = (DOCS / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices) >= 7
    missing = []
    for name, parser in sub.choices.items():
        start = page.find(f"## `pipedream {name}`")
        if start < 0:
            missing.append(name)
            continue
        section = page[start:page.find("\n## ", start + 1)]
        missing += [f"{name} {o}" for a in parser._actions if not isinstance(a, argparse._HelpAction)
                    for o in a.option_strings if f"`{o}`" not in section]
    assert not missing, f"docs/cli.md does not name {missing}"


HISTORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b[Ss]ession \d+|DESIGN\.md|prediction_log")


def test_the_docs_configs_and_docstrings_speak_of_the_project_alone() -> None:
    files = [*PAGES, *(REPO / "experiments").glob("*.yaml"), *(REPO / "pipedream").rglob("*.py"),
             *(REPO / "workflows").rglob("*.smk"), REPO / "Snakefile", REPO / "pyproject.toml"]
    found = [f"{f.relative_to(REPO)}: {m.group(0)}" for f in files for m in HISTORY.finditer(f.read_text())]
    assert not found, found
