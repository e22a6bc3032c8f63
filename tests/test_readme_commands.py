"""The README's estimate queries work against the bundled demo config: every
``ldpstream estimates adult --attrs ...`` and ``/estimates/adult?attrs=...`` in docs/readme/ names
attributes of the demo schema forming a configured marginal (the API serves configured marginals
only), with a configured estimator. (The README once asked for ``sex,income``: the attribute is
``Salary``.)"""
from __future__ import annotations

import re
from pathlib import Path

from ldpstream.config import load_config
import pytest

pytestmark = pytest.mark.core

DOCS = Path(__file__).resolve().parents[1] / "docs" / "readme"
CLI = re.compile(r"ldpstream estimates (?P<cid>[\w.-]+) --attrs (?P<attrs>[^\s`]+)"
                 r"(?: --method (?P<method>[\w-]+))?")
URL = re.compile(r"/estimates/(?P<cid>[\w.-]+)\?attrs=(?P<attrs>[^&'\s`\"]+)"
                 r"(?:&method=(?P<method>[\w-]+))?")


def _queries() -> list[tuple[str, str, str, str | None]]:
    out = []
    for path in sorted(DOCS.glob("*.md")):
        for line in path.read_text().splitlines():
            for rx in (CLI, URL):
                for m in rx.finditer(line):
                    out.append((path.name, m["cid"], m["attrs"], m["method"]))
    return out


def test_readme_estimate_queries_match_the_demo_config():
    demo = load_config().collections
    queries = [q for q in _queries() if q[1] == "adult"]
    assert len(queries) >= 6, queries  # the intro, API and compose examples are found
    coll = demo["adult"]
    marginals = {frozenset(m) for m in coll.marginals}
    for name, _, attrs, method in queries:
        names = attrs.split(",")
        unknown = [a for a in names if a not in coll.domain.attrs]
        assert not unknown, f"{name}: {attrs}: not attributes of the demo ({coll.domain.attrs})"
        assert frozenset(names) in marginals, f"{name}: {attrs} is not a configured marginal"
        assert method is None or method in coll.estimators, f"{name}: method {method}"
