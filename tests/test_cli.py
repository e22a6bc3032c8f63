"""The command line as a newcomer meets it: bare ``ldpstream`` prints help, ``--version``, every
option of every subcommand has help text, no reStructuredText markup in help, and a numeric CSV
column with too many distinct values is refused with a hint instead of becoming a category per
value."""
from __future__ import annotations

import argparse

import pytest

from ldpstream import __version__
from ldpstream.cli import build_parser, main
from ldpstream.datasets import MAX_NUMERIC_CATEGORIES, DatasetError, load_csv

pytestmark = pytest.mark.core


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def test_bare_command_prints_help_and_succeeds(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ldpstream") and "simulate" in out and "up" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"ldpstream {__version__}"


def test_every_option_of_every_subcommand_has_help():
    subs = _subparsers(build_parser())
    assert {"simulate", "bench", "up", "worker", "fleet", "estimates"} <= set(subs)
    missing = [f"{name} {a.option_strings or a.dest}" for name, p in subs.items()
               for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not missing, f"options without help text: {missing}"


def test_help_has_no_restructuredtext_markup(capsys):
    parser = build_parser()
    texts = [parser.format_help()] + [p.format_help() for p in _subparsers(parser).values()]
    for text in texts:
        assert "``" not in text and ":class:" not in text, text


def test_a_numeric_column_with_many_values_is_refused_with_a_hint():
    with pytest.raises(DatasetError) as exc:
        load_csv(None, ["age", "sex"])  # 73 distinct ages in the bundled Adult
    msg = str(exc.value)
    assert "'age'" in msg and "73 distinct values" in msg and "bin it" in msg
    assert "Declare it numeric" in msg and "simulate --numeric age" in msg
    # a few numeric values are categories like any other; so are many non-numeric ones
    assert load_csv(None, ["education-num", "sex"]).domain.shape == (16, 2)
    assert load_csv(None, ["native-country"]).domain.shape[0] == 42
    assert MAX_NUMERIC_CATEGORIES < 73


def test_a_config_over_a_numeric_column_names_the_field(tmp_path):
    from ldpstream.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("collections:\n  - id: c\n    schema: {csv: {columns: [hours-per-week, sex]}}\n"
                    "    epsilon: 1\n    marginals: [[hours-per-week, sex]]\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value).startswith("collections[0].schema.csv.") and "bin it" in str(exc.value) \
        and "schema.csv.numeric" in str(exc.value)


def test_corr_family_refuses_ways_with_a_reason(capsys):
    assert main(["simulate", "--mechanism", "corr-rr", "--ways", "3", "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--ways:" in err and "one-way marginal" in err, err
