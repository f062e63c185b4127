"""The docs site (mkdocs.yml, docs/): every page the nav names exists and every page is in the nav,
the README's links into docs/ and the pages' links to each other resolve (files and headings), the
generated config reference covers every key, and, where the `docs` extra is installed, the site
builds with `mkdocs build --strict`."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HOOK = DOCS / "hooks" / "config_reference.py"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[str]:
    """Every page of the site, relative to docs/ (docs/hooks/ holds the build's code, not pages)."""
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts)


def nav_pages() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    out: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(config["nav"])
    return out


def slug(heading: str) -> str:
    """The id Python-Markdown's toc gives a heading (its default slugify, inline code unwrapped)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def outside_code(text: str) -> str:
    """The markdown without its fenced code blocks and inline code."""
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", path.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"(?m)^#{1,6} (.+?)\s*$", text)}


def broken_links(source: Path, text: str, only_into: Path | None = None) -> list[str]:
    """Relative links of `source` whose file, or heading, does not exist."""
    bad = []
    for target in LINK.findall(outside_code(text)):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        dest = (source.parent / path_part).resolve() if path_part else source
        if only_into is not None and only_into not in dest.parents:
            continue
        if not dest.is_file():
            bad.append(f"{source.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{source.name}: {target} (no such heading)")
    return bad


def test_the_nav_names_every_page_and_only_pages_that_exist():
    nav = nav_pages()
    assert len(nav) >= 20 and "index.md" in nav
    assert not [page for page in nav if not (DOCS / page).is_file()]
    assert sorted(set(nav)) == pages(), set(pages()) ^ set(nav)
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def test_the_readme_links_into_docs_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    into_docs = [t for t in LINK.findall(outside_code(readme)) if t.startswith("docs/")]
    assert len(into_docs) >= 15, into_docs
    assert {t.split("#")[0] for t in into_docs} >= {"docs/index.md", "docs/walkthrough.md", "docs/reference/config.md",
                                                     "docs/reference/cli.md", "docs/reference/api.md"}
    assert not broken_links(ROOT / "README.md", readme, only_into=DOCS)
    assert not [t for t in LINK.findall(outside_code(readme)) if t.startswith("#")], "the README links to a " \
        "heading of its own that moved to docs/"


def test_the_pages_links_resolve():
    bad = []
    for page in pages():
        path = DOCS / page
        bad += broken_links(path, path.read_text(encoding="utf-8"))
    assert not bad, bad


def test_the_helpers_see_broken_links(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# B\n\n## A `key`: here\n\n```text\n# not a heading\n```\n", encoding="utf-8")
    text = "[ok](b.md#a-key-here) [gone](c.md) [no](b.md#not-a-heading) `[code](c.md)` ![img](x.png)"
    assert broken_links(page, text) == ["a.md: c.md (no such file)", "a.md: b.md#not-a-heading (no such heading)",
                                        "a.md: x.png (no such file)"]


def load_hook():
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("config_reference", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_covers_every_key():
    from pydantic import BaseModel

    from skillstate.config import SkillConfig
    from skillstate.prompts import PROMPT_NAMES

    hook = load_hook()
    tables = hook.config_tables()
    keys = []
    for name, field in SkillConfig.model_fields.items():
        keys.append(name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += [f"{name}.{sub}" for sub in field.annotation.model_fields]
    assert len(keys) > 100
    assert not [key for key in keys if f"| `{key}` |" not in tables]
    assert "| `num_epochs` | `int`, ≥ 1, ≤ 100,000 | `4` |" in tables
    assert all(f"`{name}`" in hook.prompt_names() for name in PROMPT_NAMES)
    page = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    assert all(marker in page for marker in hook.MARKERS)


def test_the_site_builds_strictly(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_click"):
        pytest.importorskip(module)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    config = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert "<code>final_selection.carve_from</code>" in config and "generated:" not in config
    assert "skillstate why" in (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "skillstate.trainer.Trainer" in api and "GateDecided" in api
    assert (site / "dashboard-run.jpg").is_file() and not (site / "hooks").exists()
