"""Every test file declares its tier (``pytestmark``): ``core`` (pure, no services; ``slow`` for
the minutes-long Monte Carlo ones), ``pipeline`` (real Kafka and Redis children) or ``e2e`` (whole
processes). ``make test-fast`` runs ``core and not slow``, so a core file must not use a service
fixture."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import declared_marks

pytestmark = pytest.mark.core

TESTS = Path(__file__).resolve().parent
TIERS = {"core", "pipeline", "e2e"}
SERVICE_FIXTURES = {"kafka_broker", "redis_server", "fresh_redis", "service_env", "spawn_worker"}


def _fixtures_used(tree: ast.Module) -> set[str]:
    return {a.arg for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            for a in n.args.args}


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_every_test_file_declares_one_tier(path):
    tree = ast.parse(path.read_text())
    marks = declared_marks(path)
    used = _fixtures_used(tree) & SERVICE_FIXTURES
    hint = "pipeline" if used else "core"
    assert len(marks & TIERS) == 1, (f"{path.name}: declare one tier of {sorted(TIERS)} after "
                                     f"the imports, e.g. `pytestmark = pytest.mark.{hint}`")
    if "core" in marks:
        assert not used, f"{path.name} is core but uses {sorted(used)}: mark it pipeline"
