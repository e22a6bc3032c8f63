"""The HTTP servers under hostile clients, one suite for both the worker's API and the ingest
gateway (ldpstream/http_guard.py): idle and slow connections cannot starve them (connection cap
with eviction + header deadline), 1,100 idle connections do not lock a good client out, a flood of
garbage is answered in JSON, and every error is JSON, never a traceback."""
from __future__ import annotations

import json
import socket
import time

import pytest
from conftest import write_config
from gateway_helpers import GatewayProcess

pytestmark = pytest.mark.pipeline


def _raw(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """Send raw bytes, read the whole answer: (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            if sep:
                hdrs = {k.strip().lower(): v.strip() for k, _, v in
                        (l.partition(":") for l in head.decode("latin-1").split("\r\n")[1:])}
                if len(body) >= int(hdrs.get("content-length", 1 << 30)):
                    break
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    return int(lines[0].split()[1]), hdrs, body


def _request(method: str, path: str, headers: dict | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", "Connection: close",
             f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@pytest.fixture
def worker(tmp_path, service_env, spawn_worker, unique_name):
    path = write_config(tmp_path / "c.yaml", unique_name, partitions=1)
    env = dict(service_env, LDP_WEB_MAX_CONNECTIONS="40", LDP_WEB_HEADER_TIMEOUT_S="1",
               LDP_API_TOKEN="s3cret")
    w = spawn_worker(path, env)
    w.wait_ready(60)
    return w


class Server:
    """A server under test: its port, its process and one good request (and its status)."""

    def __init__(self, port: int, pid: int, good: bytes) -> None:
        self.port, self.pid, self.good = port, pid, good

    def ask(self) -> tuple[int, bytes]:
        status, _, body = _raw(self.port, self.good)
        return status, body


TOKEN = "hardening-token-0123456789"


@pytest.fixture(params=["worker", "gateway"])
def server(request, tmp_path, service_env, spawn_worker, unique_name):
    """The worker's API (good request: GET /healthz) or the gateway (good request: POST one
    report batch), both limited to 40 connections and a 1 s header deadline."""
    limits = {"LDP_WEB_MAX_CONNECTIONS": "40", "LDP_WEB_HEADER_TIMEOUT_S": "1",
              "LDP_GATEWAY_MAX_CONNECTIONS": "40", "LDP_GATEWAY_HEADER_TIMEOUT_S": "1"}
    path = write_config(tmp_path / "c.yaml", unique_name, columns=("sex", "Salary"),
                        partitions=1, marginals=[("sex", "Salary")])
    w = spawn_worker(path, dict(service_env, **limits))
    w.wait_ready(60)
    if request.param == "worker":
        yield Server(w.web_port, w.proc.pid, _request("GET", "/healthz"))
        return
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port
    from ldpstream.producers.codec import encode_batch

    coll = load_config(path).collections[unique_name]
    port = free_port()
    tokens = json.dumps({"fleets": {"f": {"token": TOKEN, "collections": [unique_name]}}})
    gw = GatewayProcess(dict(service_env, LDP_GATEWAY_TOKENS=tokens, **limits), port,
                        str(tmp_path / "gateway.log"))
    try:
        gw.wait_for(unique_name)
        body = encode_batch(unique_name, coll.version, [[0, 1]], device_ids=[3])
        yield Server(port, gw.proc.pid, _request(
            "POST", f"/v1/collections/{unique_name}/reports",
            {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream"},
            body))
    finally:
        gw.stop()


def test_idle_and_slow_connections_cannot_starve_the_server(server):
    """150 idle connections and one slowloris against a server limited to 128 open files."""
    import resource

    port = server.port
    resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (128, 128))
    idle = []
    try:
        for _ in range(150):  # far beyond the cap of 40
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        idle.append(slow)
        t0 = time.monotonic()
        status, body = server.ask()
        assert status == 200, body
        assert time.monotonic() - t0 < 5.0
        # the slow client is closed by the header deadline (1 s), not held forever
        slow.settimeout(10)
        t0 = time.monotonic()
        try:
            assert slow.recv(100) == b""
        except ConnectionResetError:
            pass
        assert time.monotonic() - t0 < 5.0
    finally:
        for s in idle:
            s.close()


def test_1100_idle_connections_while_a_good_client_gets_200s(server):
    """Finding 2: 1,100 idle connections (a server at the usual 1,024-file limit) held while a
    good client asks 20 times: every answer is 200, each within 5 s. Before, the gateway locked
    devices out for as long as the connections were held."""
    import resource

    resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (1024, 1024))
    idle = []
    try:
        for i in range(1100):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
            if i % 100 == 99:
                t0 = time.monotonic()
                status, body = server.ask()
                assert status == 200 and time.monotonic() - t0 < 5.0, (i, status, body)
        for _ in range(10):
            t0 = time.monotonic()
            status, body = server.ask()
            assert status == 200 and time.monotonic() - t0 < 5.0, (status, body)
    finally:
        for s in idle:
            s.close()


def test_a_flood_of_garbage_is_answered_in_json(server):
    """300 malformed requests on as many connections, then a good one: every answer is JSON
    (400, or 503 when every connection is busy), the good request gets 200."""
    from concurrent.futures import ThreadPoolExecutor

    junk = [b"\x16\x03\x01garbage\r\n\r\n", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: nope\r\n\r\n"]

    def one(i: int) -> int:
        status, hdrs, body = _raw(server.port, junk[i % len(junk)])
        assert hdrs["content-type"].startswith("application/json"), (status, body)
        assert "error" in json.loads(body) and "Traceback" not in body.decode()
        return status

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(one, range(300)))
    assert set(statuses) <= {400, 414, 431, 503}, set(statuses)
    status, body = server.ask()
    assert status == 200, body


def test_every_error_is_json(worker):
    port = worker.web_port

    def check(data: bytes, status: int, needle: str) -> dict:
        got, hdrs, body = _raw(port, data)
        assert got == status, (got, body)
        assert hdrs["content-type"].startswith("application/json"), hdrs
        doc = json.loads(body)
        assert needle in doc["error"] and "Traceback" not in body.decode(), doc
        return hdrs

    check(_request("GET", "/no/such/route"), 404, "no route GET /no/such/route")
    hdrs = check(_request("DELETE", "/healthz"), 405, "not allowed")
    assert "GET" in hdrs["allow"]
    check(_request("POST", "/collections/x/refresh", body=b"x" * 200_000), 413, "too large")
    check(_request("GET", "/collections?q=" + "a" * 20_000), 414, "request line too long")
    check(_request("GET", "/collections", {"X-Big": "b" * 20_000}), 431, "header fields too large")
    check(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", 400, "malformed")
    # a token that is not latin-1 / not UTF-8: refused, never a 500
    raw = _request("POST", "/collections/x/refresh").replace(
        b"\r\n\r\n", b"\r\nAuthorization: Bearer \xff\xfe\xc3\r\n\r\n", 1)
    check(raw, 403, "token")
    raw = _request("POST", "/collections/x/refresh", {"Authorization": "Bearer s3cret"})
    check(raw, 404, "unknown collection")


def test_unhandled_error_is_json_500_without_traceback():
    import asyncio

    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    from ldpstream.agents.serve.http_guard import json_errors

    async def boom(request):
        raise RuntimeError("secret internals")

    async def run():
        app = web.Application(middlewares=[json_errors])
        app.router.add_get("/boom", boom)
        async with TestServer(app, host="127.0.0.1") as server:
            async with ClientSession() as http:
                async with http.get(server.make_url("/boom"),
                                    headers={"Accept": "text/html"}) as resp:
                    body = await resp.text()
                    assert resp.status == 500 and resp.content_type == "application/json"
        doc = json.loads(body)
        assert "RuntimeError" in doc["error"] and "secret" not in body and "Traceback" not in body

    asyncio.run(run())


def test_refresh_and_reset_with_redis_down_answer_json_503(tmp_path, service_env, fresh_redis,
                                                           spawn_worker, unique_name):
    path = write_config(tmp_path / "c.yaml", unique_name, partitions=1)
    w = spawn_worker(path, dict(service_env, REDIS_URL=fresh_redis.url, LDP_API_TOKEN="s3cret"))
    w.wait_ready(60)
    fresh_redis.stop()
    for action in ("refresh", "reset"):
        status, hdrs, body = _raw(w.web_port, _request(
            "POST", f"/collections/{unique_name}/{action}", {"Authorization": "Bearer s3cret"}),
            timeout=30)
        assert status == 503 and hdrs["content-type"].startswith("application/json"), body
        assert "Redis" in json.loads(body)["error"]


def test_gateway_healthz_checks_the_broker_for_real(unique_name):
    """Finding 2: with the broker dead, the gateway's /healthz said 200 until a device posted, and
    that POST blocked 40 s before its 503. Now /healthz asks the broker (metadata, 1 s, cached
    1.5 s): 503 within seconds, and a POST is answered 503 at once."""
    import asyncio

    import aiohttp

    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.process import free_port
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.estimators.kernels.domain import Domain
    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.codec import encode_batch
    from ldpstream.producers.gateway import IngestGateway, parse_fleets, serve
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import load_signing_key

    cid, cfg = unique_name, f"cfg.{unique_name}"
    mech = RRIndependent(Domain.from_categories({"a": ["x", "y"]}), epsilon=1.0, version=1)
    broker = EmbeddedBroker()
    broker.start()

    async def run() -> None:
        await create_topics(broker.bootstrap, {cfg: 1, f"ldp.reports.{cid}": 1}, compacted={cfg})
        async with Publisher(broker.bootstrap) as pub:
            await pub.send_and_wait(cfg, load_signing_key().sign_state(mech.state(), cid),
                                    key=cid.encode())
        gw = IngestGateway(broker.bootstrap, parse_fleets(
            {"fleets": {"f": {"token": TOKEN, "collections": [cid]}}}, "t"), config_topic=cfg)
        port = free_port()
        runner = await serve(gw, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{url}/healthz") as r:
                    assert r.status == 200 and (await r.json())["broker"]["ok"]
                broker.stop()
                t0 = time.monotonic()
                while time.monotonic() - t0 < 10:
                    async with s.get(f"{url}/healthz") as r:
                        if r.status == 503:
                            break
                    await asyncio.sleep(0.2)
                assert r.status == 503 and time.monotonic() - t0 < 5, time.monotonic() - t0
                t0 = time.monotonic()
                async with s.post(f"{url}/v1/collections/{cid}/reports",
                                  data=encode_batch(cid, 1, [[1]], device_ids=[1]),
                                  headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    assert r.status == 503 and (await r.json())["reason"] == "unavailable"
                assert time.monotonic() - t0 < 5, time.monotonic() - t0
        finally:
            await runner.cleanup()
            await gw.stop()

    try:
        asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        broker.stop()
