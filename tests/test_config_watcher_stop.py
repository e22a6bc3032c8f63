"""Stopping the config watcher (producers/device.py ``ConfigWatcher.stop``) and with it the HTTP
gateway: the following task has ended when ``stop()`` returns, a cancellation of the caller is
passed on (a supervisor's timeout around ``stop()`` works) instead of being swallowed, and
nothing is left for asyncio to report. Before, ``stop()`` swallowed its caller's cancellation and
went on while the following task was still running; that task then read the consumer ``stop()``
had dropped: ``Task exception was never retrieved ... 'NoneType' object has no attribute
'getmany'`` at ``IngestGateway.stop()``."""
from __future__ import annotations

import asyncio
import gc

import pytest
from test_device_sdk import DOM, publish

from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.producers.device import ConfigWatcher

pytestmark = pytest.mark.pipeline


def _collecting(loop: asyncio.AbstractEventLoop) -> list[str]:
    """Everything the loop's exception handler is asked to report."""
    seen: list[str] = []
    loop.set_exception_handler(lambda _l, ctx: seen.append(
        f"{ctx.get('message')}: {ctx.get('exception')!r}"))
    return seen


def test_stop_passes_on_a_cancellation_and_leaves_no_task_behind(kafka_broker, unique_name):
    topic = f"cfg.{unique_name}"

    async def run() -> None:
        seen = _collecting(asyncio.get_running_loop())
        await publish(kafka_broker.bootstrap, topic, {"c": RRIndependent(DOM, epsilon=1.0)})
        for _ in range(3):
            watcher = await ConfigWatcher(kafka_broker.bootstrap, topic=topic,
                                          max_epsilon=None).start()
            following = watcher._task
            assert following is not None and watcher.running
            stopping = asyncio.create_task(watcher.stop())
            await asyncio.sleep(0)          # stop() now waits for the following task
            stopping.cancel()               # e.g. a supervisor's timeout
            with pytest.raises(asyncio.CancelledError):
                await stopping
            await watcher.stop()            # called again: finishes
            assert following.done() and not watcher.running
            del following, stopping
            gc.collect()
            await asyncio.sleep(0.6)        # one more poll interval of the dropped consumer
            gc.collect()
        assert not seen, seen

    asyncio.run(run())


def test_gateway_start_stop_cycles_report_nothing(kafka_broker, unique_name):
    from ldpstream.producers.gateway import IngestGateway, parse_fleets

    topic = f"cfg.{unique_name}"

    async def run() -> None:
        seen = _collecting(asyncio.get_running_loop())
        await publish(kafka_broker.bootstrap, topic, {"c": RRIndependent(DOM, epsilon=1.0)})
        fleets = parse_fleets({"fleets": {"f": {"token": "t" * 20, "collections": ["c"]}}}, "t")
        for delay in (0.0, 0.05, 0.6):
            gw = IngestGateway(kafka_broker.bootstrap, fleets, config_topic=topic)
            await gw.start()
            await asyncio.sleep(delay)
            await gw.stop()
            gc.collect()
        await asyncio.sleep(0.6)
        gc.collect()
        assert not seen, seen

    asyncio.run(run())
