"""The estimate queries in the README and the demo's docs work against the bundled demo config:
every ``ldpstream estimates adult --attrs ...`` and ``/estimates/adult?attrs=...`` names
attributes of the demo schema inside a configured marginal (the API serves configured marginals
and their subsets), a configured estimator and a configured window; every docs/ page the README
links exists, and every page in docs/ is linked from the README."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ldpstream.config import load_config

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "api.md", ROOT / "docs" / "dashboards.md"]
CLI = re.compile(r"ldpstream estimates (?P<cid>[\w.-]+) --attrs (?P<attrs>[^\s`]+)"
                 r"(?: --method (?P<method>[\w-]+))?(?: --window (?P<window>\w+))?")
URL = re.compile(r"/estimates/(?P<cid>[\w.-]+)\?attrs=(?P<attrs>[^&'\s`\"]+)"
                 r"(?:&method=(?P<method>[\w-]+))?(?:&window=(?P<window>\w+))?")


def _queries() -> list[tuple[str, str, str, str | None, str | None]]:
    out = []
    for path in PAGES:
        for line in path.read_text().splitlines():
            for rx in (CLI, URL):
                for m in rx.finditer(line):
                    out.append((path.name, m["cid"], m["attrs"], m["method"], m["window"]))
    return out


def test_readme_estimate_queries_match_the_demo_config():
    coll = load_config().collections["adult"]
    queries = [q for q in _queries() if q[1] == "adult"]
    assert len(queries) >= 8, queries  # the tour, API and compose examples are found
    marginals = [set(m) for m in coll.marginals]
    windows = {w.name for w in coll.windows}
    for name, _, attrs, method, window in queries:
        names = attrs.split(",")
        unknown = [a for a in names if a not in coll.domain.attrs]
        assert not unknown, f"{name}: {attrs}: not attributes of the demo ({coll.domain.attrs})"
        assert any(set(names) <= m for m in marginals), f"{name}: {attrs} is in no configured marginal"
        assert method is None or method in coll.estimators, f"{name}: method {method}"
        assert window is None or window in windows, f"{name}: window {window}"


def test_readme_links_every_docs_page_and_only_existing_ones():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", readme))
    assert linked, "the README links its docs"
    for page in linked:
        assert (ROOT / page).is_file(), f"README links {page}, which does not exist"
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    assert len(readme.splitlines()) <= 300


def test_no_citation_leads_outside_the_repository():
    """Docstrings and docs cite the project's own specification (docs/mechanisms.md §N): every
    cited section exists, and no file names a specification that is not in the repository."""
    spec = (ROOT / "docs" / "mechanisms.md").read_text()
    sections = set(re.findall(r"^## (\d+)\. ", spec, re.MULTILINE))
    files = [p for d in ("estimators", "agents", "producers", "ldpstream", "bench", "docs", "tests")
             for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md")] + [ROOT / "README.md"]
    for path in files:
        if path.name == "test_readme_commands.py":
            continue
        text = path.read_text()
        for outside in ("MECHANISMS.md", "DESIGN.md", "docs/readme/"):
            assert outside not in text, f"{path.relative_to(ROOT)} cites {outside}"
        for sec in re.findall(r"docs/mechanisms\.md §(\d+)", text):
            assert sec in sections, f"{path.relative_to(ROOT)} cites docs/mechanisms.md §{sec}"
