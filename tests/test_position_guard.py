"""The first record taken after a partition is positioned must carry the offset it was positioned
at (agents/ingest/service.py ``starts_where_expected``): a later one is not taken, the partition is
marked for a log check and the gap is counted; a decompression-bomb replacement, which stands at
its batch's last offset, is taken. Seen under load when the broker restarted with a new log: the
consumer fetched from the old position, and 1,600 of 8,000 reports were skipped unseen."""
from __future__ import annotations

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from ldpstream.agents import metrics
from ldpstream.agents.ingest.partition import PartitionState
from ldpstream.agents.ingest.service import starts_where_expected
from ldpstream.producers.bounded_fetch import GUARD_MARKER

pytestmark = pytest.mark.core


def records(offsets: list[int], value: bytes = b"x") -> list[ConsumerRecord]:
    return [ConsumerRecord("ldp.reports.c", 0, o, 0, 0, None, value, None, 0, len(value), [])
            for o in offsets]


def state(seen: int | None, expect: int | None) -> PartitionState:
    return PartitionState(TopicPartition("ldp.reports.c", 0), "c-guard", 0, seen=seen,
                          expect=expect)


def gaps() -> float:
    return metrics.REGISTRY.get_sample_value("ldp_position_gaps_total",
                                             {"collection": "c-guard"}) or 0.0


def test_a_first_record_past_the_position_is_refused_and_checked():
    s = state(seen=-1, expect=0)           # positioned at the start of a new log
    before = gaps()
    assert not starts_where_expected(s, records([8, 9, 10]))   # offsets 0-7 would be skipped
    assert s.suspect and s.expect == 0 and gaps() == before + 1


def test_the_expected_first_record_is_taken_and_the_expectation_met():
    s = state(seen=11, expect=12)
    assert starts_where_expected(s, records([10, 11, 12, 13]))  # already seen ones are skipped
    assert not s.suspect and s.expect is None
    assert starts_where_expected(s, records([40]))   # met: later gaps are not its business


def test_a_bomb_replacement_at_its_batch_end_is_taken():
    s = state(seen=-1, expect=0)
    assert starts_where_expected(s, records([4], GUARD_MARKER + b'{"first_offset": 0}'))
    assert not s.suspect and s.expect is None


def test_nothing_expected_takes_everything():
    s = state(seen=-1, expect=None)
    assert starts_where_expected(s, records([8]))
    assert not s.suspect
