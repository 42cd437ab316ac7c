"""The repository's documentation holds together: every citation of ``docs/memory-facts.md`` names a section the
page has, and nothing cites a file outside the repository (the facts live in docs/, with their public sources)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "docs" / "memory-facts.md"
#: Where citations can sit: code, tests, benchmarks, docs, data notes, notebooks, the README.
SEARCHED = ("memsim_widget", "tests", "benchmarks", "docs", "data", "notebooks", "scripts")
SUFFIXES = {".py", ".md", ".ipynb", ".toml", ".yml", ".js"}
CITATION = re.compile(r"memory-facts\.md#([A-Za-z0-9_-]+)")


def _slug(heading: str) -> str:
    """The anchor GitHub and MkDocs both give a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _files() -> list[Path]:
    found = [ROOT / "README.md"]
    for folder in SEARCHED:
        found += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.suffix in SUFFIXES and ".ipynb_checkpoints" not in p.parts
        ]
    return found


def test_slug_is_githubs() -> None:
    assert _slug("Sharding: ZeRO and FSDP") == "sharding-zero-and-fsdp"
    assert _slug("Tracing one rank on a CPU") == "tracing-one-rank-on-a-cpu"


def test_every_cited_section_exists() -> None:
    sections = {_slug(line.lstrip("#")) for line in FACTS.read_text().splitlines() if line.startswith("## ")}
    cited = {
        (path.relative_to(ROOT).as_posix(), anchor)
        for path in _files()
        for anchor in CITATION.findall(path.read_text(encoding="utf-8", errors="replace"))
    }
    assert len(cited) > 20  # the engine, trace and benchmarks cite it
    assert sorted(c for c in cited if c[1] not in sections) == []


def test_nothing_cites_a_file_outside_the_repository() -> None:
    outside = ("REFERENCE" + ".md", "../" + "shared")  # spelt apart so that this file does not cite them
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _files()
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if any(o in line for o in outside)
    ]
    assert hits == []


def _nav_pages(node: object) -> list[str]:
    """The page paths of an ``mkdocs.yml`` nav (nested lists of ``{title: page-or-list}``)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def test_every_docs_page_is_in_the_site_nav() -> None:
    """The strict site build fails on a page left out of the nav; this says so without building the site."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    excluded = set(config.get("exclude_docs", "").split())
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - excluded
    assert sorted(pages - set(nav)) == [], "add the page to mkdocs.yml's nav"
    assert [p for p in nav if not (ROOT / "docs" / p).exists()] == []


README = ROOT / "README.md"
#: Relative link targets in Markdown: ``](path)`` or ``](path#anchor)``, web addresses left out.
LINK = re.compile(r"\]\((?!https?://)([^)#\s]+)(?:#([^)\s]+))?\)")


def test_readme_is_a_landing_page() -> None:
    """Issue 28: the README says what it is and where to read on, under 20 KB; the detail lives in docs/."""
    assert len(README.read_bytes()) < 20_000


def test_readme_links_resolve() -> None:
    """The site's strict build checks docs/ but not the README: every file it links exists, every anchor too."""
    broken = []
    for target, anchor in LINK.findall(README.read_text()):
        path = ROOT / target
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md":
            headings = {
                _slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")
            }
            if anchor not in headings:
                broken.append(f"{target}#{anchor}")
    assert broken == []


def test_readme_points_at_every_docs_page() -> None:
    """ "Where to read on" names each page of the site (the index, the includes and the plan aside)."""
    yaml = pytest.importorskip("yaml")
    excluded = set(yaml.safe_load((ROOT / "mkdocs.yml").read_text()).get("exclude_docs", "").split())
    pages = (
        {p.name for p in (ROOT / "docs").glob("*.md")}
        - excluded
        - {"index.md", "changelog.md", "contributing.md"}
    )
    linked = {
        Path(target).name for target, _ in LINK.findall(README.read_text()) if target.startswith("docs/")
    }
    assert sorted(pages - linked) == []
