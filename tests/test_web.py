"""HTTP API of a real worker (`ldpstream worker` child process, Tansu broker, redis-server):
/collections, /estimates (equal to the estimators run on the exact counts the fleet sent),
/metrics (every ldp_* metric), /healthz, the token guard, and `ldpstream estimates`."""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml
from conftest import WorkerProcess, wait_for_n
from tolerance import assert_close

pytestmark = pytest.mark.pipeline

TOKEN = "test-token-not-a-secret"
MARGINALS = [["sex", "Salary"], ["race", "sex"], ["sex", "race", "Salary"]]
ESTIMATORS = ["castell", "truncated", "hybrid-auto", "ibu"]
TOTAL = 30_000
EPSILON_KEYS = ("epsilon", "epsilon_scope", "epsilon_per_record", "epsilon_per_attribute",
                "privacy_note")


def request(url: str, path: str, method: str = "GET", token: str | None = None,
            timeout: float = 20.0) -> tuple[int, str, str]:
    """(status, content type, body) of one request; HTTP errors are returned, not raised."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    req = urllib.request.Request(url + path, method=method, headers=headers,
                                 data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def get_json(url: str, path: str, **kw) -> tuple[int, dict]:
    status, ctype, body = request(url, path, **kw)
    assert ctype.startswith("application/json"), (path, ctype, body[:200])
    return status, json.loads(body)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, kafka_broker, redis_server):
    """One worker with a token; a fleet sends TOTAL reports (exact counts kept), plus one
    undecodable message; waits until Redis holds every report."""
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet
    from ldpstream.producers.publisher import Publisher

    tmp = tmp_path_factory.mktemp("web")
    cid = f"web-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"csv": {"columns": ["sex", "race", "Salary"]}},
        "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 2, "marginals": MARGINALS,
        "estimators": ESTIMATORS, "refresh_interval_s": 1.0, "bucket_s": 1,
        "windows": ["5m", "all"], "version": 0}]}))
    config = load_config(str(path))
    coll = config.collections[cid]
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap,
               REDIS_URL=redis_server.url, LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1",
               LDP_API_TOKEN=TOKEN, LDP_APP_ID=f"ldp-{cid}")
    worker = WorkerProcess(str(path), env, str(tmp / "worker.log"))
    try:
        worker.wait_ready(90)

        async def feed():
            stats = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=TOTAL, batch=500,
                                    seed=7, keep_counts=True, devices=200)
            async with Publisher(kafka_broker.bootstrap) as pub:
                await pub.send_and_wait(coll.topic, b"definitely not a report batch")
            store = make_store(redis_server.url)
            got = await wait_for_n(store, cid, TOTAL, timeout=60)
            await store.close()
            return stats, got

        stats, got = asyncio.run(feed())
        assert got == TOTAL, worker.log_tail()
        # every estimate stored before any test asks (a test must not rely on an earlier one's
        # refresh: alone, or on another xdist worker, it would ask before the first timed one)
        status, refreshed = get_json(worker.url, f"/collections/{cid}/refresh", method="POST",
                                     token=TOKEN)
        assert status == 200, refreshed
        yield {"url": worker.url, "cid": cid, "coll": coll, "counts": stats.counts,
               "worker": worker, "path": str(path), "env": env}
    finally:
        worker.kill()


def test_collections_describe_the_config(stack):
    coll = stack["coll"]
    status, doc = get_json(stack["url"], "/collections")
    assert status == 200
    (c,) = [c for c in doc["collections"] if c["id"] == stack["cid"]]
    assert c["schema"] == {a: list(l) for a, l in zip(coll.domain.attrs, coll.domain.labels)}
    assert c["mechanism"] == "rr-ind" and c["epsilon"] == 1.0 and c["epsilon_scope"] == "attribute"
    assert c["epsilon_per_record"] == pytest.approx(coll.mechanism().epsilon)
    assert c["epsilon_per_record"] == pytest.approx(3.0)  # 3 attributes × ε = 1
    assert c["epsilon_per_attribute"] == pytest.approx(1.0) and c["privacy_note"] is None
    assert c["marginals"] == MARGINALS and c["estimators"] == ESTIMATORS
    assert c["n"] == TOTAL and c["refresh_interval_s"] == 1.0 and c["topic"] == coll.topic
    status, one = get_json(stack["url"], f"/collections/{stack['cid']}")
    assert status == 200 and one == c
    status, err = get_json(stack["url"], "/collections/nope")
    assert status == 404 and "nope" in err["error"] and stack["cid"] in err["collections"]


def test_estimates_equal_the_estimators_on_the_exact_counts(stack):
    url, cid, coll, counts = stack["url"], stack["cid"], stack["coll"], stack["counts"]
    mech = coll.mechanism()
    status, refreshed = get_json(url, f"/collections/{cid}/refresh", method="POST", token=TOKEN)
    assert status == 200 and refreshed["refreshed"] == len(MARGINALS) * len(ESTIMATORS) * 2
    _, info = get_json(url, f"/collections/{cid}")
    for attrs, method, window in itertools.product(MARGINALS, ESTIMATORS, ("5m", "all")):
            status, est = get_json(url, f"/estimates/{cid}?attrs={','.join(attrs)}&method={method}"
                                        f"&window={window}")
            assert status == 200, est
            direct = mech.estimate(counts, attrs, method)
            # IBU runs batched over the marginals in the worker (estimators/kernels/batched.py): the same
            # fixed point within its stopping tolerance, not the same iterates
            # castell is served projected onto the simplex by default (raw=1: unprojected)
            assert_close(est["cells"], (direct.projected or direct.factor).values,
                         rel=1e-6 if method == "ibu" else 1e-9)
            assert est["attrs"] == attrs and est["method"] == method and est["n"] == TOTAL
            assert est["window"] == window
            # the same ε fields as /collections: configured budget + scope, computed costs
            assert {k: est[k] for k in EPSILON_KEYS} == {k: info[k] for k in EPSILON_KEYS}
            assert est["epsilon_per_record"] == pytest.approx(mech.epsilon)
            assert est["raw_error_bound"] == pytest.approx(direct.error_bound)
            assert est["error_bound"] == pytest.approx(
                min(1.0, direct.error_bound) if est["projected"] else direct.error_bound)
            if direct.bound is not None:   # the bootstrap's upper 95 % quantile of the TVD
                assert est["error_bound_quantile"] == 0.95
                assert est["error_bound_coverage"] == ("calibrated" if method == "castell" or (
                    est.get("chosen") == "castell") else "at least")
                assert np.all(np.asarray(est["cells_low"]) <= np.asarray(est["cells_high"]))
            if method == "castell":
                status, raw = get_json(url, f"/estimates/{cid}?attrs={','.join(attrs)}"
                                            f"&method=castell&window={window}&raw=1")
                assert status == 200 and raw["projected"] is False
                assert_close(raw["cells"], direct.factor.values, rel=1e-9)
                assert raw["error_bound"] == pytest.approx(direct.error_bound)
            assert est["labels"] == [list(coll.domain.labels[coll.domain.axes([a])[0]]) for a in attrs]
            assert time.time() - 30 < est["updated_at"] <= time.time()
            if method == "hybrid-auto":
                assert est["chosen"] == direct.extra["chosen"]
            if method == "ibu":
                assert est["converged"] and est["iterations"] > 0
    # attrs in another order: the same estimate, transposed (and the default method is the first)
    _, fwd = get_json(url, f"/estimates/{cid}?attrs=sex,race,Salary")
    status, rev = get_json(url, f"/estimates/{cid}?attrs=Salary,sex,race")
    assert status == 200 and fwd["method"] == rev["method"] == "castell"
    assert rev["attrs"] == ["Salary", "sex", "race"]
    assert rev["labels"] == [fwd["labels"][2], fwd["labels"][0], fwd["labels"][1]]
    np.testing.assert_array_equal(np.asarray(rev["cells"]), np.transpose(fwd["cells"], (2, 0, 1)))
    # the index lists every configured estimate
    status, index = get_json(url, f"/estimates/{cid}")
    assert status == 200 and len(index["estimates"]) == len(MARGINALS) * len(ESTIMATORS) * 2
    assert index["windows"] == ["5m", "all"]
    status, err = get_json(url, f"/estimates/{cid}?attrs=sex,Salary&window=7d")
    assert status == 404 and "'7d'" in err["error"] and err["windows"] == ["5m", "all"]
    assert all(e["available"] and e["n"] == TOTAL for e in index["estimates"])


@pytest.mark.parametrize("query, named", [
    ("/estimates/nope?attrs=sex,race", "'nope'"),
    ("/estimates/{cid}?attrs=sex,education", "'education'"),
    ("/estimates/{cid}?attrs=sex,race&method=lasso", "'lasso'"),
])
def test_estimate_404s_name_what_is_missing(stack, query, named):
    status, err = get_json(stack["url"], query.format(cid=stack["cid"]))
    assert status == 404 and named in err["error"], err


def test_a_sub_marginal_is_summed_from_the_smallest_configured_one(stack):
    """attrs=Salary,race is in no configured marginal of its own but inside sex,race,Salary:
    served by summing that estimate over sex, and the answer says so."""
    url, cid = stack["url"], stack["cid"]
    _, full = get_json(url, f"/estimates/{cid}?attrs=sex,race,Salary&method=truncated")
    status, sub = get_json(url, f"/estimates/{cid}?attrs=Salary,race&method=truncated")
    assert status == 200, sub
    assert sub["marginalized_from"] == ["sex", "race", "Salary"] and sub["attrs"] == ["Salary", "race"]
    np.testing.assert_allclose(sub["cells"], np.sum(full["cells"], axis=0).T, rtol=1e-12)
    assert sub["labels"] == [full["labels"][2], full["labels"][1]]
    # one attribute: from the first of the smallest configured marginals holding it (sex,Salary)
    status, one = get_json(url, f"/estimates/{cid}?attrs=sex&method=castell")
    _, pair = get_json(url, f"/estimates/{cid}?attrs=sex,Salary&method=castell")
    assert status == 200 and one["marginalized_from"] == ["sex", "Salary"]
    np.testing.assert_allclose(one["cells"], np.sum(pair["cells"], axis=1), rtol=1e-12)
    assert "marginalized_from" not in pair
    # a sub-marginal keeps the TVD bound; every cell's interval is the cell ± the bound
    assert one["error_bound"] == pair["error_bound"]
    np.testing.assert_allclose(one["cells_high"],
                               np.minimum(np.asarray(one["cells"]) + one["error_bound"], 1.0),
                               rtol=1e-12)


@pytest.mark.parametrize("query", ["attrs=sex,race&method=castell&method=ibu",
                                   "attrs=sex,race&attrs=sex,Salary",
                                   "attrs=sex,race&window=all&window=5m"])
def test_a_repeated_query_parameter_is_refused(stack, query):
    status, err = get_json(stack["url"], f"/estimates/{stack['cid']}?{query}")
    assert status == 400 and "given 2 times" in err["error"], err


def test_raw_must_be_a_flag(stack):
    status, err = get_json(stack["url"], f"/estimates/{stack['cid']}?attrs=sex,race&raw=yes")
    assert status == 400 and "raw" in err["error"] and "'yes'" in err["error"], err


def wait_for_estimate(url: str, cid: str, timeout: float = 30.0) -> int:
    """Until the timed refresh has stored an estimate (the refresh timers start once the worker
    is up, a few seconds after it answers HTTP); returns the last status."""
    deadline = time.monotonic() + timeout
    while (status := get_json(url, f"/estimates/{cid}?attrs=sex,Salary")[0]) != 200 and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    return status


def test_metrics_expose_every_ldp_metric(stack):
    from ldpstream.agents.metrics import METRIC_NAMES

    url, cid = stack["url"], stack["cid"]
    assert wait_for_estimate(url, cid) == 200
    # at least two timed refreshes (1 s interval; on a loaded machine one can take longer)
    deadline = time.monotonic() + 30
    while True:
        status, ctype, text = request(url, "/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        done = [line for line in text.splitlines()
                if line.startswith("ldp_estimate_refresh_seconds_count{")
                and f'collection="{cid}"' in line and float(line.rsplit(" ", 1)[1]) >= 2]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            samples[name_labels] = float(value)
    for name in METRIC_NAMES:
        assert f"# TYPE {name.removesuffix('_total')} " in text or f"# TYPE {name} " in text, name

    def value(name, **labels):
        want = [f'{k}="{v}"' for k, v in labels.items()]
        hits = [v for k, v in samples.items()
                if k.split("{")[0] == name and all(w in k for w in want)]
        assert hits, f"no sample {name} {labels}"
        return hits[0]

    assert value("ldp_reports_ingested_total", collection=cid) == TOTAL
    assert value("ldp_collection_reports", collection=cid) == TOTAL
    assert value("ldp_reports_rejected_total", collection=cid, reason="bad_magic") >= 1
    assert value("ldp_messages_consumed_total", collection=cid) >= TOTAL / 500
    assert value("ldp_batch_apply_seconds_count", collection=cid) >= 1
    assert value("ldp_consumer_lag_messages", collection=cid) >= 0
    assert value("ldp_estimate_refresh_seconds_count", collection=cid) >= 2
    assert time.time() - 10 < value("ldp_estimate_last_refresh_timestamp_seconds", collection=cid)
    assert value("ldp_epsilon_per_record", collection=cid) == pytest.approx(3.0)
    assert value("ldp_refresh_interval_seconds", collection=cid) == 1.0
    assert value("ldp_ingest_expected", collection=cid) == 1.0
    assert value("ldp_estimate_freshness_seconds", collection=cid) > 0
    _, est = get_json(url, f"/estimates/{cid}?attrs=sex,Salary&method=truncated")
    cell = f"{est['labels'][0][1]}|{est['labels'][1][1]}"
    assert est["window"] == "5m"  # the collection's first window
    for window in ("5m", "all"):  # every report is in both windows: the same estimate
        assert value("ldp_estimate_cell", collection=cid, marginal="sex|Salary", method="truncated",
                     window=window, cell=cell) == pytest.approx(est["cells"][1][1])
        assert value("ldp_estimate_error_bound", collection=cid, marginal="sex|Salary",
                     method="castell", window=window) > 0
        assert value("ldp_estimate_failing", collection=cid, marginal="sex|Salary",
                     method="castell", window=window) == 0
    # the previous 5 minutes hold no report: no drift is measured (rather than a bogus one)
    assert est["drift_tvd"] is None
    n_cells = sum(1 for k in samples if k.startswith("ldp_estimate_cell{") and cid in k)
    assert n_cells == (2 * 2 + 5 * 2 + 2 * 5 * 2) * len(ESTIMATORS) * 2  # configured marginals



def test_healthz(stack):
    status, doc = get_json(stack["url"], "/healthz")
    assert status == 200 and doc["status"] == "ok"
    assert doc["checks"]["redis"]["ok"] and doc["checks"]["broker"]["ok"]
    assert doc["checks"]["ingest"]["assigned"]


def test_query_cli(stack, capsys):
    from ldpstream.cli import main

    url, cid = stack["url"], stack["cid"]
    assert main(["estimates", "--url", url]) == 0
    assert cid in capsys.readouterr().out
    assert main(["estimates", cid, "--attrs", "Salary,sex", "--method", "truncated",
                 "--url", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _, direct = get_json(url, f"/estimates/{cid}?attrs=Salary,sex&method=truncated")
    assert doc["cells"] == direct["cells"] and doc["attrs"] == ["Salary", "sex"]
    assert main(["estimates", cid, "--attrs", "sex,Salary", "--url", url]) == 0
    table = capsys.readouterr().out
    assert "sex \\ Salary" in table and f"n={TOTAL}" in table
    assert main(["estimates", cid, "--attrs", "sex,education", "--url", url]) == 2
    assert "'education'" in capsys.readouterr().err


def test_token_guard_and_reset(stack, redis_server):
    from ldpstream.agents.app import make_store

    async def offsets():
        store = make_store(redis_server.url)
        try:
            return await store.offsets(cid, 16)
        finally:
            await store.close()

    url, cid = stack["url"], stack["cid"]
    for path in (f"/collections/{cid}/refresh", f"/collections/{cid}/reset"):
        assert get_json(url, path, method="POST")[0] == 403
        assert get_json(url, path, method="POST", token="wrong")[0] == 403
        assert get_json(url, path, method="POST", token=TOKEN + "x")[0] == 403
    assert get_json(url, "/collections/nope/refresh", method="POST", token=TOKEN)[0] == 404
    assert wait_for_estimate(url, cid) == 200  # an estimate exists before the reset
    before = asyncio.run(offsets())
    status, doc = get_json(url, f"/collections/{cid}/reset", method="POST", token=TOKEN)
    assert status == 200 and doc["reset"] is True and doc["keys_deleted"] > 0
    assert asyncio.run(offsets()) == before != {}  # kept: a rebalance must not recount
    _, coll = get_json(url, f"/collections/{cid}")
    assert coll["n"] == 0
    time.sleep(1.5)  # timers run on empty counts: no estimate is made up
    status, err = get_json(url, f"/estimates/{cid}?attrs=sex,Salary")
    assert status == 404 and "no reports in the last 5m" in err["error"], err
    status, err = get_json(url, f"/estimates/{cid}?attrs=sex,Salary&window=all")
    assert status == 404 and "no reports counted yet" in err["error"], err


def test_without_a_configured_token_every_change_is_forbidden(stack, tmp_path):
    env = {k: v for k, v in stack["env"].items() if k != "LDP_API_TOKEN"}
    env["LDP_APP_ID"] += "-b"
    w = WorkerProcess(stack["path"], env, str(tmp_path / "w.log"))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = get_json(w.url, "/collections", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, w.log_tail()
                time.sleep(0.3)
        assert status == 200
        for token in (None, TOKEN, ""):
            status, err = get_json(w.url, f"/collections/{stack['cid']}/refresh", method="POST",
                                   token=token)
            assert status == 403 and "LDP_API_TOKEN" in err["error"]
    finally:
        w.kill()
