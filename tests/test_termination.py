"""SIGTERM before a command's own stop handler (ldpstream/termination.py): recorded as well as
raised, so a signal whose exception CPython drops (the compiler's constant folding clears any
exception but KeyboardInterrupt) still stops the command: the CLI re-raises it after the
import, and a loop handler installed later stops at once."""
from __future__ import annotations

import asyncio
import signal

import pytest

from ldpstream import termination

pytestmark = pytest.mark.core


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(termination, "_received", False)
    previous = signal.signal(signal.SIGTERM, termination.on_sigterm)
    yield
    signal.signal(signal.SIGTERM, previous)


def _lose_a_sigterm() -> None:
    """SIGTERM whose exception is swallowed, as the compiler's constant folding does."""
    try:
        signal.raise_signal(signal.SIGTERM)   # to this thread; its handler runs before return
    except termination.Terminated:
        pass
    else:
        raise AssertionError("the SIGTERM handler did not run")


def test_a_lost_sigterm_is_raised_again(fresh):
    termination.raise_if_received()   # nothing received: nothing raised
    _lose_a_sigterm()
    assert termination.received()
    with pytest.raises(termination.Terminated):
        termination.raise_if_received()


def test_a_loop_handler_installed_after_a_lost_sigterm_stops_at_once(fresh):
    async def run(lose: bool) -> bool:
        if lose:
            _lose_a_sigterm()
        stop = asyncio.Event()
        termination.on_loop(stop.set)
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)   # leaves SIG_DFL behind
            signal.signal(signal.SIGTERM, termination.on_sigterm)

    assert asyncio.run(run(lose=False)) is False
    assert asyncio.run(run(lose=True)) is True


def test_a_loop_not_yet_running_takes_sigterm_instead_of_its_tasks(fresh):
    """The worker hands SIGTERM to its loop before the loop runs: raised inside one of the loop's
    tasks, the exception would end that task alone and the command run on."""
    loop = asyncio.new_event_loop()
    stopped: list[bool] = []
    try:
        termination.on_loop(lambda: stopped.append(True), (signal.SIGTERM,), loop=loop)

        async def busy() -> str:
            signal.raise_signal(signal.SIGTERM)   # lands while a task runs
            await asyncio.sleep(0.2)
            return "ran on"

        assert loop.run_until_complete(busy()) == "ran on"   # no Terminated in the task
        assert stopped == [True] and not termination.received()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        loop.close()
        signal.signal(signal.SIGTERM, termination.on_sigterm)
