"""The ε ledger fails closed (producers/ledger.py, docs/security.md "The ε ledger fails closed"):
a clock stepped back never frees budget, and a ledger deleted or replaced while its marker exists
is refused instead of starting again with a full budget."""
from __future__ import annotations

import shutil

import pytest

from ldpstream.producers.ledger import Budget, Ledger, LedgerMissing

pytestmark = pytest.mark.core


def test_clock_stepped_back_never_frees_budget(tmp_path):
    """Finding 6: budget 8 per day, 4 per report. Before: after the refusal, stepping the clock
    back 1-5 s let five more reports through (spends 'in the future' were ignored)."""
    with Ledger(tmp_path / "l.sqlite", budget=Budget(8.0, 86400.0)) as led:
        t = 1_000_000.0
        for dt in (0.0, 1.0):
            assert led.refusal(4.0, t + dt) is None
            led.commit("c", t + dt, 4.0)
        assert led.refusal(4.0, t + 2) is not None
        for back in (1, 2, 3, 4, 5, 3600, 86400 * 3):
            assert led.refusal(4.0, t + 2 - back) is not None, back
            assert led.spent(t + 2 - back, 86400.0) == pytest.approx(8.0)
        # a spend while the clock is behind is stamped with the ledger's time (in order)
        assert led.now(t - 50) == t + 1
        assert led.refusal(4.0, t + 1 + 86400.0 + 1) is None   # a real day later: free again


def test_missing_or_replaced_ledger_is_refused(tmp_path):
    path = tmp_path / "device.sqlite"
    with Ledger(path, budget=Budget(8.0)) as led:
        led.commit("c", 1000.0, 8.0)
    assert (tmp_path / "device.sqlite.marker").exists()
    shutil.copy(path, tmp_path / "backup.sqlite")
    path.unlink()
    with pytest.raises(LedgerMissing, match="missing"):
        Ledger(path, budget=Budget(8.0))
    assert not path.exists()                            # nothing created on the way
    Ledger(tmp_path / "other.sqlite").close()           # another device's ledger moved in
    shutil.copy(tmp_path / "other.sqlite", path)
    with pytest.raises(LedgerMissing, match="not the one"):
        Ledger(path)
    shutil.copy(tmp_path / "backup.sqlite", path)       # the real one back: accepted, still spent
    with Ledger(path, budget=Budget(8.0)) as led:
        assert led.refusal(1.0, 1001.0) is not None
    # the marker can live with the device's identity, away from the ledger
    ident = tmp_path / "identity" / "ledger.marker"
    Ledger(tmp_path / "l2.sqlite", marker=ident).close()
    (tmp_path / "l2.sqlite").unlink()
    with pytest.raises(LedgerMissing):
        Ledger(tmp_path / "l2.sqlite", marker=ident)
    Ledger(":memory:").close()                          # in memory: no marker
