"""docs/configuration.md's field reference equals the one generated from the config models, and
the generator covers every field of every model (ldpstream/config_docs.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ldpstream.cli import main
from ldpstream.config_docs import BEGIN, END, SECTIONS, reference, render_page

pytestmark = pytest.mark.core

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_committed_reference_equals_the_models():
    text = PAGE.read_text(encoding="utf-8")
    assert render_page(text) == text, \
        "docs/configuration.md is stale: run `ldpstream config-reference --write docs/configuration.md`"
    assert main(["config-reference", "--check", str(PAGE)]) == 0


def test_every_field_is_documented_with_its_default():
    ref = reference()
    for _, model in SECTIONS:
        for name, f in model.model_fields.items():
            assert f"| `{f.alias or name}` |" in ref, name
            assert f.description, f"{model.__name__}.{name} has no description"
    assert "| `device_quota` | mapping | none |" in ref
    assert "| `partitions` | integer | 4 |" in ref
    assert "| `reports` | integer | **required** | ≥ 1 |" in ref


def test_check_fails_on_a_stale_page(tmp_path, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(PAGE.read_text(encoding="utf-8").replace("| `partitions` | integer | 4 |",
                                                              "| `partitions` | integer | 1 |"))
    assert main(["config-reference", "--check", str(stale)]) == 1
    assert "config-reference --write" in capsys.readouterr().out
    assert main(["config-reference", "--write", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")
    (tmp_path / "bare.md").write_text("# no markers\n")
    assert main(["config-reference", "--check", str(tmp_path / "bare.md")]) == 2
    assert BEGIN in reference() and END in reference()
