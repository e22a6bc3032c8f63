"""The worker's device state with Redis as the state of record (agents/store/memo_log.py): the
index (id and row position, 12 bytes a device), segments whose rows are rewritten in place or
appended, and what a delta writes (``~`` patches, staged new segments) replayed against a model
of Redis: the log read back always holds each device's latest row, where the index says."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from ldpstream.agents.store.device_memo import (
    META,
    DeviceTable,
    decode_rows,
    distinct,
    row_bytes,
    value_code,
)
from ldpstream.agents.store.memo_log import (
    SEG_BITS,
    SEG_FILL,
    STAGE_MIN,
    DeviceIndex,
    EpochLog,
    LogPending,
    index_segments,
    patch_blob,
    table_of_segments,
)

pytestmark = pytest.mark.core


def _rows(n: int, width: int, version: int, hi: int, rng: np.random.Generator) -> np.ndarray:
    rows = np.empty((n, META + width), dtype=np.int32)
    rows[:, 0], rows[:, 1], rows[:, 2] = version, 7, width
    rows[:, META:] = rng.integers(0, hi, size=(n, width))
    return rows


def test_index_matches_a_dict_through_appends_side_inserts_and_merges():
    rng = np.random.default_rng(3)
    DeviceIndex.MERGE_MIN = 64
    try:
        idx, model = DeviceIndex(), {}
        for step in range(200):
            if step % 3 == 0:   # beyond every id held: appended in place
                ids = np.arange(10, dtype=np.uint64) + np.uint64(max(model, default=0) + 1)
            else:
                ids = np.unique(rng.integers(0, 5000, size=40).astype(np.uint64))
            pos = rng.integers(0, 1 << 32, size=ids.size).astype(np.uint32)
            idx.upsert(ids, pos)
            model.update(zip(ids.tolist(), pos.tolist()))
        ask = np.arange(0, max(model) + 10, dtype=np.uint64)
        found, pos = idx.find(ask)
        assert found.sum() == len(model) == len(idx)
        assert dict(zip(ask[found].tolist(), pos[found].tolist())) == model
        assert idx.count_between(100, 2000) == sum(100 <= k < 2000 for k in model)
        assert idx.ids.tolist() == sorted(model) and idx.nbytes == 16 * len(model)
    finally:
        DeviceIndex.MERGE_MIN = 1 << 16


def test_distinct_and_in_order_table_upserts_match_numpy_and_a_dict():
    """The sort-based ``distinct`` (np.unique is slow on numpy 2.3+) gives np.unique's answer;
    a device table fed ids in order (appended) and out of order (inserted), with wider int64
    rows, holds what a dict holds, its rows int32; a lookup outside the ids held finds none."""
    rng = np.random.default_rng(9)
    for a in (np.empty(0, np.uint32), np.array([5], np.uint64), np.arange(7, dtype=np.uint32),
              rng.integers(0, 50, 300).astype(np.uint32),
              rng.integers(0, 1 << 63, 300, dtype=np.int64).astype(np.uint64)):
        assert distinct(a).tolist() == np.unique(a).tolist() and distinct(a).dtype == a.dtype
    t, model = DeviceTable(), {}
    top = 0
    for step in range(60):
        if step % 2:
            ids = np.arange(top, top + 50, dtype=np.uint64)
            top += 50
        else:
            ids = np.unique(rng.integers(0, top + 1, 30)).astype(np.uint64)
        width = 2 + step % 3
        rows = np.zeros((ids.size, META + width), dtype=np.int64)
        rows[:, 2], rows[:, META:] = width, rng.integers(0, 9, (ids.size, width))
        t.upsert(ids, rows)
        model.update({int(i): r[:META + width].tolist() for i, r in zip(ids, rows)})
        found, got = t.lookup(np.arange(top + 5, dtype=np.uint64))
        assert found.sum() == len(model) == len(t) and got.dtype == np.int32
        assert {int(i): r[:META + r[2]].tolist() for i, r in
                zip(np.flatnonzero(found), got)} == model
    found, got = t.lookup(np.arange(top + 5, top + 9, dtype=np.uint64))
    assert not found.any() and got.shape[0] == 0
    assert t.ids.tolist() == sorted(model) and t.rows.dtype == np.int32


def test_rows_take_the_narrowest_code_and_a_new_segment_when_it_changes():
    assert [value_code(np.array(v)) for v in ([0, 255], [-1, 3], [0, 1 << 15], [])] == [2, 1, 0, 2]
    assert row_bytes(8, 2) == 20 and row_bytes(8, 1) == 28 and row_bytes(8, 0) == 44
    rng = np.random.default_rng(1)
    log = EpochLog("memo:L:5", 0.0)
    _, p1 = log.place(np.arange(3, dtype=np.uint64), _rows(3, 8, 1, 200, rng))
    _, p2 = log.place(np.arange(3, 6, dtype=np.uint64), _rows(3, 8, 1, 1000, rng))
    assert log.seg_code == [2, 1] and log.seg_width == [8, 8]
    assert (p1 >> SEG_BITS).tolist() == [0] * 3 and (p2 >> SEG_BITS).tolist() == [1] * 3
    assert np.diff(p1.astype(np.int64)).tolist() == [5, 5]   # 20-byte rows: 5 words apart


def _apply(segs: dict[int, bytearray], lp: LogPending) -> None:
    """What a flush and the apply script do with a delta: the segments dense with superseded
    rows read whole and rebuilt (memo_gate ``fetch``, then a staged RENAME), the others patched
    (scripts.py ``~``): rewrite, append."""
    for seg, (width, code, _, off) in lp.to_fetch().items():
        if lp.dense(seg, off.size):
            lp.rebuild(seg, width, code, off, bytes(segs[seg]))
    for seg, data in lp.replaced.items():
        segs[seg] = bytearray(data)
    for seg, (app, size, off, rows) in lp.patches().items():
        assert seg not in lp.replaced
        blob = patch_blob(app, size, off, rows)
        alen, L = struct.unpack_from("<II", blob, 1)
        buf = segs.setdefault(seg, bytearray())
        rest = blob[9 + alen:]
        n = len(rest) // (4 + L) if L else 0
        for i in range(n):
            (o,) = struct.unpack_from("<I", rest, 4 * i)
            assert o + L <= len(buf)
            buf[o:o + L] = rest[4 * n + L * i:4 * n + L * (i + 1)]
        buf += blob[9:9 + alen]


@pytest.mark.parametrize("dense", [False, True])
def test_rewrites_in_place_and_appends_replay_to_the_latest_row_of_each_device(dense, monkeypatch):
    """Three deltas of a model worker against a model Redis: new devices appended (a big one
    in fresh segments), known ones rewritten in place (from Redis or from the delta's own
    rows), a wider report appended anew; reading the segments back gives every device's latest
    row at the position the index holds; ``dense``: the segments read whole and rebuilt instead
    of patched row by row."""
    from ldpstream.agents.store import memo_log

    monkeypatch.setattr(memo_log, "ROW_NS", 1 << 40 if dense else 0)
    rng = np.random.default_rng(5)
    log, segs, latest = EpochLog("memo:L:5", 0.0), {}, {}
    big = SEG_FILL // 10
    for delta, (n_new, n_old, width) in enumerate([(big, 0, 8), (100, 500, 8), (10, 50, 9)]):
        lp = LogPending(log.name, 0.0, log.tail())
        top = max(latest, default=-1) + 1
        known = rng.choice(np.array(sorted(latest), dtype=np.uint64), size=min(n_old, len(latest)),
                           replace=False) if latest else np.empty(0, dtype=np.uint64)
        for half in (known[:len(known) // 2], known[len(known) // 2:]):   # two runs
            ids = np.sort(np.concatenate([half, np.arange(top, top + n_new // 2, dtype=np.uint64)]))
            top += n_new // 2
            rows = _rows(ids.size, width, delta, 200, rng)
            found, pos = log.index.find(ids)
            w, c = log.slots(pos[found]) if found.any() else (np.empty(0), np.empty(0))
            fits = np.zeros(ids.size, dtype=bool)
            if found.any():
                at = np.flatnonzero(found)
                mem, _ = lp.rows_at(pos[at])
                lp.fetch_add(pos[at][~mem], w[~mem], c[~mem])
                lp.note_sizes(pos[at][~mem], log.seg_len)
                ok = w >= width
                lp.write_at(pos[at][ok], rows[at[ok]], w[ok])
                lp.note_widths(pos[at][ok], w[ok], c[ok])
                fits[at[ok]] = True
            app = np.flatnonzero(~fits)
            chunks, p = log.place(ids[app], rows[app], lp.start)
            lp.chunks += chunks
            log.index.upsert(ids[app], p)
            latest.update({int(d): r[:META + r[2]].tolist() for d, r in zip(ids, rows)})
        _apply(segs, lp)
        assert bool(lp.replaced) == (dense and delta > 0)
        if delta == 0:
            assert len(segs) > 1 and all(lp.fresh(s) for s in segs)
            assert max(len(b) for b in segs.values()) <= SEG_FILL
            assert any(len(b) >= STAGE_MIN for b in segs.values())
    data = [bytes(segs[s]) for s in range(len(segs))]
    table = table_of_segments(data)
    got = {int(d): r[:META + r[2]].tolist() for d, r in zip(table.ids, table.rows)}
    assert got == latest
    idx, lens, widths, codes = index_segments(data)
    assert idx.ids.tolist() == log.index.ids.tolist() and idx.pos.tolist() == log.index.pos.tolist()
    assert lens == [len(b) for b in data] and widths == log.seg_width and codes == log.seg_code
    pos = idx.pos.astype(np.int64)   # each position holds its device's row
    for d, p in list(zip(idx.ids.tolist(), pos.tolist()))[::97]:
        s, off = p >> SEG_BITS, 4 * (p & ((1 << SEG_BITS) - 1))
        size = row_bytes(widths[s], codes[s])
        row = decode_rows(np.frombuffer(data[s][off:off + size], dtype=np.uint8)[None, :],
                          widths[s], codes[s])[0]
        assert row[:META + row[2]].tolist() == latest[d]
