"""Refusals Mosquitto makes itself, counted by the bridge (docs/security.md, "Refusals the broker
counts").

What the broker refuses never reaches the bridge's subscription, so the broker is configured with
``log_dest topic`` (and ``log_type notice``, ``connection_messages true``): it publishes its
notice-level log lines to ``$SYS/broker/log/N``, which the bridge's user may read (ACL). Mosquitto
2.0.11 writes, at notice level:

- ``New client connected from <addr> as <client id> (p5, c1, k60, u'<user>').`` — remembered, so a
  later refusal of that client id names its user, and a fleet's devices log in with the fleet's
  name as user name;
- ``Client <client id> disconnected, not authorised.`` → ``bad_credentials`` (the client id is
  ``<unknown>``: a refused CONNECT is logged before the broker keeps its id or user name, so the
  fleet is ``-``);
- ``Client <client id> disconnected due to oversize packet.`` (over ``max_packet_size``) or
  ``... oversize payload.`` → ``too_large``;
- ``Client <client id> disconnected due to malformed packet.`` or ``... protocol error.`` →
  ``malformed_packet``.

A publish outside the client's ACL is logged only as ``Denied PUBLISH from <client id> ...`` at
*debug* level, which Mosquitto never publishes to ``$SYS/broker/log``: the topic cannot show it.
Where the bridge can read the broker's log file and the broker logs at debug level (opt-in: it
writes several lines per message), :func:`follow` reads that file and counts only those lines
(``not_authorized``; the other refusals come from the topic, so nothing is counted twice).
"""
from __future__ import annotations

import asyncio
import os
import re
from collections import OrderedDict
from typing import Callable, Container

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["BrokerLog", "BrokerRefusals", "REASONS", "UNKNOWN_FLEET", "follow", "refused_counter"]

#: the fleet label of a refusal whose user name is not a fleet's (or not known at all)
UNKNOWN_FLEET = "-"
#: how many connected client ids are remembered (the oldest are forgotten first)
MAX_CLIENTS = 100_000

_CONNECTED = re.compile(r"New client connected from \S+ as (?P<id>.+) \(p\d+, c\d, k\d+"
                        r"(?:, u'(?P<user>[^']*)')?\)\.$")
_DENIED = re.compile(r"Denied PUBLISH from (?P<id>\S+) \(")
_CLIENT = re.compile(r"Client (?P<id>.+?) (?:disconnected(?P<how>[,:]? .*)?|closed its connection|"
                     r"has exceeded timeout, disconnecting)\.?$")
_REFUSALS = {", not authorised.": "bad_credentials",
             " due to oversize packet.": "too_large",
             " due to oversize payload.": "too_large",
             " due to malformed packet.": "malformed_packet",
             " due to protocol error.": "malformed_packet"}
#: the reasons :class:`BrokerLog` counts
REASONS = ("bad_credentials", "not_authorized", "too_large", "malformed_packet")


def _message(line: str) -> str:
    """The line without Mosquitto's ``<unix time>: `` prefix (``log_timestamp true``)."""
    head, sep, rest = line.partition(": ")
    return rest if sep and head.isdigit() else line


def refused_counter(registry: CollectorRegistry) -> Counter:
    """``ldp_mqtt_broker_refused_total{fleet,reason}`` in ``registry``."""
    return Counter("ldp_mqtt_broker_refused_total", "MQTT connections and publishes the broker "
                   "refused itself (from its log on $SYS/broker/log).", ["fleet", "reason"],
                   registry=registry)


class BrokerLog:
    """Counts refusals in ``refused`` (:func:`refused_counter`) from Mosquitto's log lines;
    ``fleets`` are the fleet names (a device's MQTT user name is its fleet's name)."""

    def __init__(self, fleets: Container[str], refused: Counter,
                 count: Container[str] = REASONS) -> None:
        self.fleets = fleets
        self.refused = refused
        self.count = count
        self._users: OrderedDict[str, str] = OrderedDict()

    def fleet_of(self, client_id: str) -> str:
        user = self._users.get(client_id)
        return user if user is not None and user in self.fleets else UNKNOWN_FLEET

    def feed(self, line: str) -> str | None:
        """Take one log line; returns the refusal's reason when it was one (and counted)."""
        text = _message(line.strip())
        if (m := _CONNECTED.match(text)) is not None:
            self._users[m["id"]] = m["user"] or ""
            self._users.move_to_end(m["id"])
            while len(self._users) > MAX_CLIENTS:
                self._users.popitem(last=False)
            return None
        if (m := _DENIED.match(text)) is not None:
            return self._count(m["id"], "not_authorized")
        if (m := _CLIENT.match(text)) is None:
            return None
        reason = _REFUSALS.get(m["how"] or "")
        if reason is not None:
            reason = self._count(m["id"], reason)
        self._users.pop(m["id"], None)  # the connection is gone; a reconnect is logged again
        return reason

    def _count(self, client_id: str, reason: str) -> str | None:
        if reason not in self.count:
            return None
        self.refused.labels(self.fleet_of(client_id), reason).inc()
        return reason


async def follow(path: str, log: BrokerLog, *, poll_s: float = 0.2,
                 status: Callable[[str], None] = lambda _s: None) -> None:
    """Feed ``log`` every line appended to the broker's log file ``path`` from now on (a file
    that shrinks, rotated or truncated, is read again from its start); ``status`` hears
    ``"following"`` or why the file cannot be read. Runs until cancelled."""
    position: int | None = None
    pending = b""
    while True:
        try:
            size = os.path.getsize(path)
            if position is None or size < position:
                position, pending = (size if position is None else 0), b""
            if size > position:
                with open(path, "rb") as fh:
                    fh.seek(position)
                    chunk = fh.read(size - position)
                position += len(chunk)
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    log.feed(line.decode("utf-8", "replace"))
            status("following")
        except OSError as exc:
            status(f"cannot read {path}: {exc.__class__.__name__}: {exc}")
        await asyncio.sleep(poll_s)


class BrokerRefusals:
    """The bridge's sources of broker refusals: ``topic`` (fed the lines of
    ``$SYS/broker/log/N``) and, with ``log_file``, the broker's debug log file followed by
    :meth:`start` for the ACL-denied publishes; :meth:`health` says whether both are read."""

    def __init__(self, fleets: Container[str], refused: Counter, subscribed: Gauge,
                 log_file: str | None = None) -> None:
        self.topic = BrokerLog(fleets, refused)
        self._file_log = BrokerLog(fleets, refused, count=("not_authorized",))
        self.log_file = log_file
        self.subscribed = subscribed
        self.detail = "not subscribed yet"
        self.file_detail = "not read yet" if log_file is not None else "not given"
        self._task: asyncio.Task[None] | None = None

    def on_suback(self, refused: bool, reason: str) -> None:
        """The broker's answer to the log topic's subscription (refused: see the ACL)."""
        self.detail = f"refused: {reason} (see the ACL of the bridge's user)" if refused \
            else "subscribed"
        self.subscribed.set(0 if refused else 1)

    def _file_status(self, detail: str) -> None:
        self.file_detail = detail

    def start(self) -> None:
        if self.log_file is not None:
            self._task = asyncio.create_task(follow(self.log_file, self._file_log,
                                                    status=self._file_status))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def health(self) -> dict[str, object]:
        ok = self.detail == "subscribed" and (self.log_file is None
                                              or self.file_detail == "following")
        return {"ok": ok, "detail": self.detail, "file": self.log_file,
                "file_detail": self.file_detail}
