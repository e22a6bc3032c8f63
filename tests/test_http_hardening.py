"""The worker's HTTP port under hostile clients: idle and slow connections cannot starve
``/healthz`` (connection cap + header deadline), and every error is JSON, never a traceback."""
from __future__ import annotations

import json
import socket
import time

import pytest

from conftest import write_config

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


def test_idle_and_slow_connections_cannot_starve_healthz(worker):
    """150 idle connections and one slowloris against a worker limited to 128 open files."""
    import resource

    port = worker.web_port
    resource.prlimit(worker.proc.pid, resource.RLIMIT_NOFILE, (128, 128))
    idle = []
    try:
        for _ in range(150):  # far beyond the cap of 40
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        idle.append(slow)
        t0 = time.monotonic()
        status, hdrs, body = _raw(port, _request("GET", "/healthz"))
        assert status == 200 and json.loads(body)["status"] == "ok"
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

    from ldpstream.agents.http_guard import json_errors

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
