"""A memoized state without a device description (the Python SDK's fallback path, which runs the
mechanism rebuilt from the state) keeps the newest rotation period when the device clock steps
back, as the description path does (docs/device-protocol.md, "Ledger"): the permanent responses
of the older period are never drawn, nor charged, again. Before, the fallback path redrew them
(twice the permanent ε charged; the budget held, the promise did not)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from test_device_sdk import Clock

from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.stream.longitudinal import Memoize
from ldpstream.producers.device import ConfigWatcher
from ldpstream.producers.ledger import Budget, Ledger
from ldpstream.producers.sdk import DeviceClient, RecordingTransport

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})
REC = {"os": "ios", "plan": "pro"}
ROT = 3600.0


async def _publish_without_description(bootstrap: str, topic: str, cid: str,
                                       mech: RRIndependent) -> None:
    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import load_signing_key

    state = dict(mech.device_state())
    state.pop("device")   # a state from before device descriptions: the SDK's fallback path
    key = load_signing_key()
    assert key is not None
    await create_topics(bootstrap, {topic: 1}, compacted={topic})
    async with Publisher(bootstrap) as pub:
        await pub.send_and_wait(topic, key.sign_state(state, cid), key=cid.encode())


def test_fallback_path_keeps_the_newest_period_when_the_clock_steps_back(
        kafka_broker, unique_name, tmp_path):
    topic, cid = f"cfg.{unique_name}", "app"
    mech = RRIndependent(DOM, epsilon=1.0, version=4, memoize=Memoize(ROT, (2.0, 2.0)))
    eps_perm = sum(ch.epsilon(P) for P in mech.permanent)

    async def run() -> None:
        await _publish_without_description(kafka_broker.bootstrap, topic, cid, mech)
        watcher = await ConfigWatcher(kafka_broker.bootstrap, topic=topic,
                                      max_epsilon=None).start()
        try:
            clock = Clock(ROT * 1000 + 10)
            client = DeviceClient(cid, watcher=watcher, transport=RecordingTransport(),
                                  ledger=Ledger(tmp_path / "d.sqlite",
                                                budget=Budget(100.0, 86400.0 * 30)),
                                  device_id=5, batch_size=1, clock=clock,
                                  rng=np.random.default_rng(1))
            assert client.program() is None, "the state must have no device description"
            first = await client.report(REC)
            assert first.status == "queued" and first.epsilon == pytest.approx(eps_perm)
            clock.t -= ROT            # stepped back into the previous period
            again = await client.report(REC)
            # the newest period is kept: the record was reported in it already
            assert again.status == "duplicate" and again.epsilon == 0, again
            other = await client.report({"os": "ios", "plan": "free"})
            # only the changed attribute's new value is drawn, in the newest period
            assert other.status == "queued"
            assert other.epsilon == pytest.approx(ch.epsilon(mech.permanent[1]), rel=1e-9)
            spent = client.ledger.spent(clock.t + ROT, 86400.0)
            assert spent == pytest.approx(eps_perm + ch.epsilon(mech.permanent[1]), rel=1e-9)
        finally:
            await watcher.stop()

    asyncio.run(run())
