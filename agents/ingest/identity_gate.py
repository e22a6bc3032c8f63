"""Per-device identity in the ingest worker (docs/security.md "Per-device identity"): with the
fleets' secrets configured (``LDP_DEVICE_SECRETS_FILE``), a batch is counted only as the device
that authenticated it. Its MAC is checked under the key derived from its fleet's secret and its
sender's id (ldpstream/credentials/device_keys.py), every device id inside must be the sender's,
and the batch is then counted under the sender's *server id* (its fleet's tag and a hash of its
id): the batch key, the quota, the dedupe state and the per-device state all follow the
authenticated device. Anything else goes to ``ldp.dlq`` with one of
:data:`~ldpstream.names.AUTH_REASONS`."""
from __future__ import annotations

import dataclasses
import hmac

import numpy as np
from aiokafka.structs import ConsumerRecord

from ldpstream.agents import metrics
from ldpstream.agents.ingest.acks import AckReconciler
from ldpstream.credentials.device_keys import MAC_BYTES, FleetSecrets, batch_mac, server_id
from ldpstream.producers.codec import ReportBatch


class Unauthentic(Exception):
    """A batch not counted as any device's: ``reason`` in ``AUTH_REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class IdentityGate:
    """Verify batches against the fleets' secrets (``None``: off, batches count as they say)."""

    def __init__(self, fleets: FleetSecrets | None, acks: AckReconciler | None = None) -> None:
        self.fleets = fleets
        #: told of every verified batch's reports (acknowledged equals counted)
        self.acks = acks

    @property
    def enforced(self) -> bool:
        return self.fleets is not None

    def verify(self, cid: str, m: ConsumerRecord, b: ReportBatch) -> ReportBatch:
        """``b`` with its sender and device ids replaced by the sender's server id, or raises
        :class:`Unauthentic`. One HMAC for the key and one over the message: no per-report
        work besides one vectorized comparison of the device ids."""
        if self.fleets is None:
            return b
        if b.fleet is None or b.mac is None or b.key is None:
            raise Unauthentic("unauthenticated", "the batch carries no device MAC (flag bit 2): "
                              "this worker counts only batches authenticated by their device")
        key = self.fleets.key(b.fleet, b.key[0])
        if key is None:
            raise Unauthentic("unknown_fleet", f"fleet {b.fleet!r} has no secret on this worker")
        raw = m.value or b""
        if not hmac.compare_digest(batch_mac(key, raw[:-MAC_BYTES]), b.mac):
            raise Unauthentic("bad_mac", f"the MAC is not device {b.key[0]}'s of fleet "
                              f"{b.fleet!r}")
        sender = b.key[0]
        if b.device_ids is not None and (b.device_ids != np.uint64(sender)).any():
            raise Unauthentic("sender_mismatch", f"device ids other than the authenticated "
                              f"sender {sender} of fleet {b.fleet!r}")
        sid = server_id(b.fleet, sender)
        metrics.DEVICE_BATCHES.labels(cid, b.fleet).inc()
        if self.acks is not None:
            self.acks.took(cid, b.fleet, b.n)
        return dataclasses.replace(b, key=(sid, b.key[1]),
                                   device_ids=np.full(b.n, sid, dtype=np.uint64))
