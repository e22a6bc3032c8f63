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
