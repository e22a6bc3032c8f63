"""A newcomer's first hour: ports and URLs from the environment (ldpstream/endpoint.py), the
partition default, bench help and output, progress, errors that name the field and the nearest
valid name, values without numpy reprs, a device told which key variable to set."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ldpstream import endpoint
from ldpstream.cli import _endpoint_defaults, build_parser, main

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in (endpoint.ENV_WEB_PORT, endpoint.ENV_API_URL):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # this test's own `up` record
    return monkeypatch


def parsed(argv: list[str]):
    args = build_parser().parse_args(argv)
    _endpoint_defaults(args)
    return args


def test_web_port_from_the_environment(clean_env, capsys):
    assert parsed(["worker"]).web_port == parsed(["up"]).web_port == 6066
    clean_env.setenv("LDP_WEB_PORT", "7123")
    assert parsed(["worker"]).web_port == parsed(["up"]).web_port == 7123
    assert parsed(["up", "--web-port", "7000"]).web_port == 7000       # the option wins
    assert parsed(["estimates"]).url == "http://127.0.0.1:7123"
    clean_env.setenv("LDP_WEB_PORT", "66o6")
    assert main(["worker"]) == 2
    assert "LDP_WEB_PORT='66o6': not a TCP port" in capsys.readouterr().err


def test_api_url_follows_the_environment_then_the_running_up(clean_env):
    assert parsed(["estimates"]).url == "http://127.0.0.1:6066"
    endpoint.record_up("http://127.0.0.1:6071")        # this process plays the running `up`
    assert parsed(["estimates"]).url == "http://127.0.0.1:6071"
    clean_env.setenv("LDP_API_URL", "http://10.1.2.3:6066")
    assert parsed(["estimates"]).url == "http://10.1.2.3:6066"
    assert parsed(["estimates", "--url", "http://h:1"]).url == "http://h:1"
    clean_env.delenv("LDP_API_URL")
    endpoint.clear_up()
    assert parsed(["estimates"]).url == "http://127.0.0.1:6066"


def test_a_dead_ups_record_is_ignored(clean_env):
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = endpoint.up_record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{{"url": "http://127.0.0.1:6099", "pid": {dead.pid}}}')
    assert endpoint.recorded_up_url() is None
    assert parsed(["estimates"]).url == "http://127.0.0.1:6066"


def test_the_partition_default_is_stated_and_used():
    from ldpstream.config import parse_config
    from ldpstream.names import DEFAULT_PARTITIONS

    coll = parse_config({"collections": [{
        "id": "p", "schema": {"attributes": {"a": ["x", "y"]}}, "epsilon": 1.0,
        "marginals": [["a"]]}]}).collections["p"]
    assert coll.partitions == DEFAULT_PARTITIONS == 4
    page = (ROOT / "docs/configuration.md").read_text()
    assert f"| `partitions` | integer | {DEFAULT_PARTITIONS} |" in page
    assert f"partitions: {DEFAULT_PARTITIONS}           # the default" in page


@pytest.mark.parametrize("name", ["castell", "adult", "pipeline", "mechanisms", "gateway",
                                  "refresh", "marginals", "adaptive", "fetch", "sdk"])
def test_every_benchmark_has_its_own_help(name, capsys):
    from ldpstream.bench.run import describe

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["bench", name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    summary, _ = describe(name)
    assert f"usage: ldpstream bench {name}" in out and "--quick" in out and "--json" in out
    assert " ".join(summary.split()[:4]) in " ".join(out.split()), out
    assert "``" not in out and ":func:" not in out and ":class:" not in out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_bench_marginals_ends_with_a_table_not_a_dict(capsys):
    from ldpstream.bench.marginals import print_targets

    print_targets({"adult": {"ways=2": {"ratio_ge_1.3_everywhere": False,
                                        "below_1.3": [(8.0, "3way", 1.12)],
                                        "within_1.2_of_floor_at_eps8": True}}})
    out = capsys.readouterr().out
    assert "adult" in out and "8 3way ×1.12" in out and "{" not in out and "'" not in out


@pytest.mark.parametrize("shown", ["1", "0"])
def test_simulate_shows_progress_on_stderr(shown):
    import json
    import sys

    env = dict(os.environ, LDP_PROGRESS=shown)
    out = subprocess.run([sys.executable, "-m", "ldpstream.cli", "simulate", "--ways", "2",
                          "--subsets", "3", "--estimator", "castell", "--json"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["results"]                      # stdout stays JSON
    if shown == "1":
        assert "simulate" in out.stderr and "/3" in out.stderr, out.stderr
    else:
        assert "simulate" not in out.stderr, out.stderr


def test_a_device_without_a_public_key_is_told_which_variable_to_set(monkeypatch):
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_PUBLIC_KEY_FILE

    monkeypatch.delenv(ENV_PUBLIC_KEY, raising=False)
    monkeypatch.delenv(ENV_PUBLIC_KEY_FILE, raising=False)
    watcher = ConfigWatcher("127.0.0.1:9")           # never started: no broker needed
    watcher._take(b"adult", b"a signed state")
    watcher._take(b"adult", b"another")
    assert watcher.rejected == {"no_public_key": 2}
    summary = watcher.refusal_summary()
    assert summary.startswith("no_public_key ×2: no public key pinned: set LDP_CONFIG_PUBLIC_KEY ")
    assert "LDP_CONFIG_PUBLIC_KEY_FILE" in summary and "ldpstream keygen" in summary


@pytest.mark.parametrize("kw,field", [({"epsilon": "8"}, "Budget.epsilon"),
                                      ({"epsilon": 1.0, "window_s": "1d"}, "Budget.window_s"),
                                      ({"epsilon": True}, "Budget.epsilon"),
                                      ({"epsilon": -1.0}, "Budget.epsilon")])
def test_a_bad_budget_names_its_field(kw, field):
    import numpy as np

    from ldpstream.producers.ledger import Budget

    with pytest.raises(ValueError, match=rf"^{field} must be a"):
        Budget(**kw)
    assert Budget(np.float64(2.0), np.int64(3600)).window_s == 3600   # numpy numbers are numbers


def config_error(doc: dict) -> str:
    from ldpstream.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    return str(exc.value)


BASE = {"id": "c", "schema": {"attributes": {"sex": ["F", "M"], "plan": ["eco", "pro"]}},
        "epsilon": 1.0, "marginals": [["sex", "plan"]]}


@pytest.mark.parametrize("change,expect,guess", [
    ({"epsilonn": 1.0}, "collections[0].epsilonn: unknown field (allowed: id, schema", "epsilon"),
    ({"mechanism": "rr-indep"}, "collections[0].mechanism: unknown mechanism 'rr-indep'", "rr-ind"),
    ({"estimators": ["castel"]}, "collections[0].estimators[0]: unknown estimator 'castel'",
     "castell"),
    ({"marginals": [["sexx", "plan"]]}, "collections[0].marginals[0]: unknown attribute 'sexx'",
     "sex"),
])
def test_config_errors_name_the_field_and_the_nearest_valid_name(change, expect, guess):
    msg = config_error({"collections": [dict(BASE, **change)]})
    assert expect in msg and msg.endswith(f"did you mean {guess!r}?"), msg


def test_a_far_off_name_gets_no_guess():
    msg = config_error({"collections": [dict(BASE, mechanism="zzzz")]})
    assert "unknown mechanism 'zzzz'" in msg and "did you mean" not in msg


def test_values_in_messages_are_shown_as_written_not_as_numpy_reprs(tmp_path):
    import numpy as np

    from ldpstream.datasets import DatasetError, load_csv
    from ldpstream.estimators.kernels.domain import Domain, SchemaError
    from ldpstream.estimators.mechanism import mechanism_class

    dom = Domain(("sex", "plan"), (2, 2), (("F", "M"), ("eco", "pro")))
    csv = tmp_path / "d.csv"
    csv.write_text("sex,plan\nF,eco\nM,Eco\n")
    with pytest.raises(DatasetError) as exc:
        load_csv(str(csv), ["sex", "plan"], domain=dom)
    msg = str(exc.value)
    assert "has value 'Eco' outside the configured domain (categories: eco, pro); did you mean " \
           "'eco'?" in msg and "np.str_" not in msg, msg
    with pytest.raises(SchemaError) as exc:
        dom.encode({"sex": np.array(["F"]), "plan": np.array(["ecoo"])})
    assert "unknown category 'ecoo'" in str(exc.value) and "np.str_" not in str(exc.value)
    assert str(exc.value).endswith("did you mean 'eco'?")
    with pytest.raises(KeyError, match="did you mean 'plan'"):
        dom.axes(["plam"])
    with pytest.raises(ValueError, match="did you mean 'rrba'"):
        mechanism_class("rrbaa")
    with pytest.raises(DatasetError, match="did you mean 'plan'"):
        load_csv(str(csv), ["sex", "plna"])


def test_estimates_lists_collections_untruncated_in_80_columns(monkeypatch, capsys):
    """`ldpstream estimates` on an 80-column terminal: no header or name cut to "mechan…"."""
    from ldpstream import query
    from ldpstream.agents.serve.web import collection_info
    from ldpstream.config import load_config

    monkeypatch.setenv("COLUMNS", "80")
    coll = load_config().collections["adult"]
    query.print_collections({"collections": [collection_info(coll, coll.mechanism(), 123456)]})
    out = capsys.readouterr().out
    assert "…" not in out, out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    flat = " ".join(out.split())
    for word in ("mechanism", "partitioned", "123,456", "relationship×marital-status×sex",
                 "norm-sub", "4"):
        assert word in flat, (word, out)


def test_a_worker_on_a_busy_port_is_told_a_free_one(clean_env, capsys):
    import re
    import socket

    from ldpstream.dev.process import free_port

    clean_env.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")   # never reached: refused first
    clean_env.setenv("REDIS_URL", "redis://127.0.0.1:9/0")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["worker", "--web-port", str(port)]) == 2
    err = capsys.readouterr().err
    free = int(re.search(r"port (\d+) is free: `ldpstream worker --web-port \1` or "
                         r"`LDP_WEB_PORT=\1`", err).group(1))
    assert free > port, err


def test_a_mistyped_estimator_gets_the_nearest_one(capsys):
    """`simulate --estimator castel`: the valid ones, and the nearest (docs/simulate.md)."""
    assert main(["simulate", "--mechanism", "rr-ind", "--estimator", "castel", "--epsilon",
                 "2"]) == 2
    err = capsys.readouterr().err
    assert "'castel' does not apply" in err and err.rstrip().endswith("did you mean 'castell'?")


def test_the_status_rate_is_steady_at_a_steady_rate():
    """up's status line: reports/s over 5 s, so counts that land in lumps (a 1 s difference
    swings between 0 and twice the rate) read close to the rate."""
    from collections import deque

    from ldpstream.embedded import _rate

    points: deque = deque()
    n, rates = 0, []
    for t in range(40):
        if t % 2 == 0:  # 4,000 counted every other second: 2,000/s
            n += 4000
        rates.append(_rate(points, float(t), n))
    assert all(1500 <= r <= 2500 for r in rates[6:]), rates


def test_the_cli_states_the_drift_test_as_the_page_does(capsys):
    """`ldpstream estimates c --attrs ...`: drift statistic, its threshold and the alarm, not only
    the TVD change (docs/windows.md)."""
    from ldpstream.query import print_estimate

    est = {"collection": "c", "attrs": ["a"], "method": "castell", "window": "5m",
           "labels": [["x", "y"]], "cells": [0.25, 0.75], "n": 10, "error_bound": 0.1,
           "error_bound_quantile": 0.95, "error_bound_coverage": "calibrated",
           "drift_tvd": 0.12, "drift_statistic": 31.5, "drift_threshold": 10.8,
           "drift_alarm": True, "updated_at": None}
    print_estimate(est)
    out = " ".join(capsys.readouterr().out.split())
    assert "drift: ALARM, statistic 31.50 against threshold 10.80 (TVD change 0.120)" in out, out
    print_estimate(dict(est, drift_alarm=False, drift_statistic=2.0))
    assert "drift: no alarm, statistic 2.00 against threshold 10.80" in \
        " ".join(capsys.readouterr().out.split())
    print_estimate(dict(est, drift_statistic=None, drift_threshold=None, drift_tvd=None))
    assert "drift: not measured" in " ".join(capsys.readouterr().out.split())


def test_up_keeps_its_dev_identity_in_the_state_directory(clean_env, tmp_path):
    """Without a configured key, `up` signs with a key pair created once in $LDP_STATE_DIR (else
    $XDG_STATE_HOME/ldpstream) and reused; the banner names the key and where it is."""
    from ldpstream.embedded import _dev_identity, _identity_lines

    clean_env.delenv("LDP_STATE_DIR", raising=False)
    clean_env.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert endpoint.state_dir() == tmp_path / "xdg" / "ldpstream"
    clean_env.setenv("LDP_STATE_DIR", str(tmp_path / "state"))
    key, (priv, pub) = _dev_identity()
    again, _ = _dev_identity()
    assert again.verify_key.to_text() == key.verify_key.to_text()  # the same across restarts
    assert priv.parent == tmp_path / "state" and oct(priv.stat().st_mode & 0o777) == "0o600"
    assert pub.read_text().strip() == key.verify_key.to_text()
    banner = _identity_lines(key, (priv, pub))
    assert key.verify_key.to_text() in banner and f"kept in {tmp_path / 'state'}" in banner
