"""The worker's state objects without Kafka or Redis: a partition's state is reset in one place
and a delta taken before a reset or revocation is stale (agents/ingest/partition.py); one owner of the
mechanism in force per collection (agents/control/collection_state.py); the fault hook wraps the intake
only when asked (agents/ingest/faults.py)."""
import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from ldpstream.agents.control.collection_state import CollectionStates
from ldpstream.agents.ingest import faults
from ldpstream.agents.ingest.log_identity import LogMark
from ldpstream.agents.ingest.partition import Partitions
from ldpstream.config import load_config

pytestmark = pytest.mark.core

TP = TopicPartition("ldp.reports.x", 0)


def record(offset: int, value: bytes = b"v") -> ConsumerRecord:
    return ConsumerRecord(TP.topic, TP.partition, offset, 1000, 0, None, value, None,
                          0, len(value), ())


def test_assign_reset_revoke_and_stale_deltas():
    parts = Partitions()
    s = parts.assign(TP, "x")
    assert parts.get(TP) is s and s.seen is None and s.pending is None
    s.seen = 9
    pend = s.open_pending(LogMark(10, 1000, 1))
    assert pend.base == 9 and pend.mark is not None and not parts.is_stale(pend)
    pend.n = 5
    parts.recount()
    assert parts.pending_reports == 5 and parts.with_pending() == [TP]
    s.quota_used = {1: {7: 2}}
    parts.reset(s, seen=12)
    assert s.pending is None and s.quota_used is None and s.seen == 12
    assert parts.is_stale(pend) and parts.pending_reports == 0
    fresh = s.open_pending(None)
    assert fresh.base == 12 and not parts.is_stale(fresh)
    parts.revoke(TP)
    assert parts.get(TP) is None and parts.is_stale(fresh)
    again = parts.assign(TP, "x")            # a re-assignment never revives an old delta
    assert again is not s and again.epoch > fresh.epoch and parts.is_stale(fresh)


def test_take_pending_hands_over_and_clears():
    parts = Partitions()
    s = parts.assign(TP, "x")
    s.seen = -1
    s.marked = True
    pend = s.open_pending(LogMark(0, 1, 2))
    assert pend.mark is None                 # the partition has a mark already
    pend.n = 3
    parts.recount()
    assert parts.take_pending([TP]) == {TP: pend}
    assert s.pending is None and parts.pending_reports == 0 and parts.take_pending([TP]) == {}


def test_collection_state_owns_the_mechanism_in_force():
    config = load_config()
    states = CollectionStates(config.collections)
    cid = next(iter(config.collections))
    st = states[cid]
    first = st.current
    assert dict(st.versions()) == {first.version: first} and st.configured is first
    layout = st.layout(first.version)
    assert st.layout(first.version) is layout
    new = config.collections[cid].mechanism()
    new.version = first.version + 1
    assert st.adopt(new) is first and st.current is new
    assert dict(st.versions()) == {v: new for v in new.accepted_versions()}
    assert states.known() == {c: states[c].versions() for c in states}


def test_fault_hook_wraps_take_only_when_asked():
    taken = []

    def take(state, msgs):
        taken.append([m.offset for m in msgs])

    assert faults.injected(take, env={}) is take
    hooked = faults.injected(take, env={faults.ENV_ABORT_ON_HEX: b"BOOM".hex()})
    assert hooked is not take
    parts = Partitions()
    s = parts.assign(TP, "x")
    s.seen = 0
    hooked(s, [record(0, b"BOOM: already taken"), record(1)])   # at or below seen: not taken
    assert taken == [[0, 1]]


def test_a_delta_of_many_cells_waits_for_more_reports():
    """Due by size (agents/ingest/service.py ``due_reports``): ``batch_reports`` for a delta of
    few cells; REPORTS_PER_CELL a cell for a wide one (a numeric attribute's outputs), at most
    WIDE_DELTA_MAX times ``batch_reports``. A delta's cells are its arrays' (one per bucket)."""
    import numpy as np

    from ldpstream.agents.ingest.service import REPORTS_PER_CELL, WIDE_DELTA_MAX, due_reports
    from ldpstream.agents.store.layout import Layout

    assert due_reports(20_000, 128) == 20_000                  # 8 attributes of 16 categories
    assert due_reports(20_000, 2_072) == REPORTS_PER_CELL * 2_072 > 20_000   # 8 of 259 outputs
    assert due_reports(20_000, 10**6) == WIDE_DELTA_MAX * 20_000
    assert due_reports(1_000, 0) == 1_000
    s = Partitions().assign(TP, "x")
    s.seen = 9
    pend = s.open_pending(None)
    assert pend.cells() == 0
    layout = Layout.of(0, load_config().collections["adult"].tensors())
    pend.deltas[(layout, 3)] = np.zeros(layout.size, dtype=np.int64)
    pend.deltas[(layout, None)] = np.zeros(layout.size, dtype=np.int64)
    assert pend.cells() == 2 * layout.size
