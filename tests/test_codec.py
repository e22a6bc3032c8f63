"""Report-batch codec: round trips, every DecodeError reason, check_batch reasons, fuzzing."""
from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest

from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.producers.codec import (
    DLQ_PAYLOAD_LIMIT,
    MAGIC,
    DecodeError,
    ReportBatch,
    batch_from_json,
    batch_to_json,
    check_batch,
    decode_batch,
    decode_uniform,
    dlq_record,
    encode_batch,
    explain_batch,
)

pytestmark = pytest.mark.core


def rr_ind(sizes, version=0) -> RRIndependent:
    """A real mechanism whose report bounds are ``sizes`` (one GRR channel per attribute)."""
    return RRIndependent(Domain(tuple(f"a{i}" for i in range(len(sizes))), tuple(sizes)),
                         epsilon=1.0, version=version)


@pytest.mark.parametrize("hi,dtype", [(2, np.uint8), (255, np.uint8), (256, np.uint16),
                                      (65535, np.uint16), (65536, np.uint32),
                                      (2**32 - 1, np.uint32)])
@pytest.mark.parametrize("width", [1, 3, 8])
@pytest.mark.parametrize("with_ids", [False, True])
def test_round_trip(hi, dtype, width, with_ids):
    rng = np.random.default_rng(hi + width)
    n = 37
    reports = rng.integers(0, hi, size=(n, width), endpoint=True, dtype=np.int64)
    reports[0, 0] = hi
    ids = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) * 2 if with_ids else None
    blob = encode_batch("adult", 7, reports, device_ids=ids, sent_at=1234.5)
    b = decode_batch(blob)
    assert b.collection == "adult" and b.version == 7 and b.sent_at == 1234.5
    assert b.reports.dtype == dtype and b.reports.shape == (n, width)
    np.testing.assert_array_equal(b.reports, reports)
    if with_ids:
        assert b.device_ids.dtype == np.uint64
        np.testing.assert_array_equal(b.device_ids, ids)
    else:
        assert b.device_ids is None
    assert batch_from_json(batch_to_json(b)) == b
    # exact size: header + ids + values
    expect = 4 + 3 + len("adult") + 4 + 8 + 4 + 2 + 1 + (8 * n if with_ids else 0) \
        + n * width * np.dtype(dtype).itemsize
    assert len(blob) == expect


@pytest.mark.parametrize("with_ids", [False, True])
def test_batch_key_round_trip_and_layout(with_ids):
    """The batch key (sender, sequence) sits right after the fixed header, before device ids."""
    ids = [5, 2**64 - 1] if with_ids else None
    key = (2**64 - 1, 2**63 + 7)
    blob = encode_batch("c", 3, [[1, 2], [3, 4]], device_ids=ids, sent_at=9.0, key=key)
    b = decode_batch(blob)
    assert b.key == key and b.reports.tolist() == [[1, 2], [3, 4]]
    head = 4 + 3 + 1 + 4 + 8 + 4 + 2 + 1
    assert blob[5] == (0x03 if with_ids else 0x02)
    assert blob[head:head + 16] == struct.pack("<QQ", *key)
    assert len(blob) == head + 16 + (16 if with_ids else 0) + 4
    assert batch_from_json(batch_to_json(b)) == b
    assert decode_batch(encode_batch("c", 3, [[1, 2], [3, 4]], device_ids=ids, sent_at=9.0)) != b
    # truncating the key is detected; keyed messages leave the uniform fast path to decode_batch
    with pytest.raises(DecodeError):
        decode_batch(blob[:head + 8])
    assert decode_uniform([blob, blob]) is None


@pytest.mark.parametrize("key", [(1,), (1, 2, 3), (-1, 0), (0, 2**64), (1.5, 2), (True, 1)])
def test_batch_key_refused(key):
    with pytest.raises(ValueError, match="key"):
        encode_batch("c", 0, [[1]], key=key)


def test_single_report_and_unicode_collection():
    blob = encode_batch("météo-φ", 0, [3, 1, 4])
    b = decode_batch(bytearray(blob))
    assert b.collection == "météo-φ" and b.n == 1 and b.reports.tolist() == [[3, 1, 4]]
    assert b.sent_at > 1e9  # defaults to now


def test_layout_is_the_documented_one():
    blob = encode_batch("c", 258, np.array([[1, 2]]), device_ids=[5], sent_at=2.0)
    assert blob[:4] == MAGIC and blob[4] == 1 and blob[5] == 1 and blob[6] == 1 and blob[7:8] == b"c"
    version, sent_at, n, width, code = struct.unpack_from("<IdIHB", blob, 8)
    assert (version, sent_at, n, width, code) == (258, 2.0, 1, 2, 1)
    assert struct.unpack_from("<Q", blob, 8 + 19)[0] == 5
    assert blob[-2:] == b"\x01\x02"


@pytest.mark.parametrize("bad", [
    dict(collection=""), dict(collection="x" * 256), dict(version=-1), dict(version=2**32),
    dict(reports=[[-1, 0]]), dict(reports=[[2**32, 0]]), dict(reports=np.zeros((0, 2), int)),
    dict(reports=np.zeros((2, 0), int)), dict(reports=[[0.5, 1.0]]), dict(reports=np.zeros((2, 2, 2), int)),
    dict(device_ids=[1, 2, 3]), dict(device_ids=[-1, 2]), dict(sent_at=float("nan")),
])
def test_encode_rejects_bad_input(bad):
    args = dict(collection="c", version=1, reports=[[1, 2], [3, 4]])
    ids = bad.pop("device_ids", None)
    sent = bad.pop("sent_at", 1.0)
    args.update(bad)
    with pytest.raises(ValueError):
        encode_batch(args["collection"], args["version"], args["reports"], device_ids=ids,
                     sent_at=sent)


def _reason(data, **kw):
    with pytest.raises(DecodeError) as ei:
        decode_batch(data, **kw)
    assert str(ei.value).startswith(ei.value.reason + ": ")
    return ei.value.reason


def test_every_truncation_prefix_is_truncated():
    blob = encode_batch("adult", 3, np.arange(12).reshape(4, 3), device_ids=np.arange(4))
    for k in range(len(blob)):
        assert _reason(blob[:k]) == "truncated", k
    assert decode_batch(blob).n == 4


def test_decode_reasons():
    good = encode_batch("adult", 3, np.arange(12).reshape(4, 3))
    assert _reason(good, max_bytes=len(good) - 1) == "oversized"
    assert decode_batch(good, max_bytes=len(good)).n == 4
    assert _reason(b"x" * 2_000_000) == "oversized"
    assert _reason(b"LDPX" + good[4:]) == "bad_magic"
    assert _reason(b"{\"json\": 1}") == "bad_magic"
    assert _reason(b"L") == "truncated"  # a prefix of the magic
    assert _reason(b"") == "truncated"
    assert _reason(good + b"\x00") == "malformed"          # trailing bytes
    assert _reason(good[:4] + b"\x02" + good[5:]) == "malformed"   # format version
    assert _reason(good[:5] + b"\x04" + good[6:]) == "malformed"   # unknown flag
    assert _reason(good[:5] + b"\x02" + good[6:]) == "truncated"   # a key the bytes lack
    assert _reason(good[:6] + b"\x00" + good[7:]) == "malformed"   # empty collection id
    bad_utf8 = bytearray(good)
    bad_utf8[7] = 0xFF
    assert _reason(bytes(bad_utf8)) == "malformed"
    pos_code = 7 + 5 + 4 + 8 + 4 + 2
    assert _reason(good[:pos_code] + b"\x03" + good[pos_code + 1:]) == "malformed"  # dtype code
    pos_n = 7 + 5 + 4 + 8
    zero_n = good[:pos_n] + struct.pack("<I", 0) + good[pos_n + 4:pos_code + 1]
    with pytest.raises(DecodeError) as ei:
        decode_batch(zero_n)
    assert ei.value.reason == "malformed" and ei.value.collection == "adult"
    nan = good[:7 + 5 + 4] + struct.pack("<d", float("inf")) + good[7 + 5 + 12:]
    assert _reason(nan) == "malformed"
    # a header that claims more reports than present
    big_n = good[:pos_n] + struct.pack("<I", 5) + good[pos_n + 4:]
    with pytest.raises(DecodeError) as ei:
        decode_batch(big_n)
    assert ei.value.reason == "truncated" and ei.value.collection == "adult"
    with pytest.raises(DecodeError):
        decode_batch("not bytes")  # type: ignore[arg-type]  # deliberately the wrong type


def test_fuzz_random_bytes_only_decode_error():
    rng = np.random.default_rng(20240501)
    good = encode_batch("adult", 3, np.arange(24).reshape(8, 3) % 5, device_ids=np.arange(8))
    seen: dict[str, int] = {}
    ok = 0
    for i in range(6000):
        kind = i % 3
        if kind == 0:  # pure noise, sometimes starting with the magic
            data = rng.integers(0, 256, size=int(rng.integers(0, 200)), dtype=np.uint8).tobytes()
            if rng.random() < 0.5:
                data = MAGIC + data
        elif kind == 1:  # flip a few bytes of a valid message
            arr = np.frombuffer(good, dtype=np.uint8).copy()
            idx = rng.integers(0, len(arr), size=int(rng.integers(1, 4)))
            arr[idx] = rng.integers(0, 256, size=len(idx))
            data = arr.tobytes()
        else:  # splice: cut and append noise
            cut = int(rng.integers(0, len(good)))
            data = good[:cut] + rng.integers(0, 256, size=int(rng.integers(0, 30)),
                                             dtype=np.uint8).tobytes()
        try:
            b = decode_batch(data, max_bytes=150)
            ok += 1
            assert b.reports.ndim == 2 and b.reports.shape[0] >= 1
        except DecodeError as exc:
            seen[exc.reason] = seen.get(exc.reason, 0) + 1
    assert set(seen) == {"oversized", "bad_magic", "truncated", "malformed"}
    assert ok > 0  # byte flips inside the values still decode


def test_check_batch_reasons():
    mech = rr_ind([2, 3, 4], version=1)
    known = {"adult": {1: mech}}
    rep = np.array([[1, 2, 3], [0, 0, 0]])
    assert check_batch(decode_batch(encode_batch("adult", 1, rep)), known) is None
    assert check_batch(decode_batch(encode_batch("other", 1, rep)), known) == "unknown_collection"
    assert check_batch(decode_batch(encode_batch("adult", 2, rep)), known) == "unknown_version"
    assert check_batch(decode_batch(encode_batch("adult", 1, rep[:, :2])), known) == "wrong_width"
    for col, val in [(0, 2), (1, 3), (2, 4), (2, 300)]:
        bad = rep.copy()
        bad[1, col] = val
        b = decode_batch(encode_batch("adult", 1, bad))
        assert check_batch(b, known) == "out_of_domain"
        reason, detail = explain_batch(b, known)
        assert f"field {col} = {val}" in detail


def test_check_batch_in_the_reports_dtype():
    """The bounds are compared in the reports' own dtype: a bound past the dtype's range admits
    every value it can hold, a signed negative value is out of domain."""
    mech = rr_ind([2, 3, 300], version=1)
    known = {"adult": {1: mech}}
    wide = np.array([[1, 2, 255], [0, 0, 0]], dtype=np.uint8)
    assert explain_batch(ReportBatch("adult", 1, wide), known) is None
    signed = np.array([[1, 2, 299], [0, -1, 0]], dtype=np.int16)
    reason, detail = explain_batch(ReportBatch("adult", 1, signed), known)
    assert reason == "out_of_domain" and "report 1 field 1 = -1" in detail
    over = np.array([[1, 2, 300]], dtype=np.uint16)
    assert explain_batch(ReportBatch("adult", 1, over), known)[0] == "out_of_domain"


def test_check_batch_with_one_bound_for_every_field():
    """Every field with the same bound (checked with one max): the last value in range passes,
    one past it anywhere is out of domain, in uint8, uint16 and signed reports."""
    for card, dt in ((16, np.uint8), (259, np.uint16), (259, np.int16)):
        known = {"c": {1: rr_ind([card] * 4, version=1)}}
        rep = np.full((50, 4), card - 1, dtype=dt)
        assert explain_batch(ReportBatch("c", 1, rep), known) is None
        for r, c in ((0, 0), (49, 3), (17, 2)):
            bad = rep.copy()
            bad[r, c] = card
            reason, detail = explain_batch(ReportBatch("c", 1, bad), known)
            assert reason == "out_of_domain" and f"report {r} field {c} = {card}" in detail
        if np.dtype(dt).kind == "i":
            neg = rep.copy()
            neg[3, 1] = -1
            assert explain_batch(ReportBatch("c", 1, neg), known)[0] == "out_of_domain"


def test_json_debug_form_errors():
    for text in ["nope", "[1]", '{"collection": 1, "version": 1, "reports": [[1]]}',
                 '{"collection": "c", "version": 1.5, "reports": [[1]]}',
                 '{"collection": "c", "version": 1, "reports": [[1], [1, 2]]}',
                 '{"collection": "c", "version": 1, "reports": [[0.5]]}',
                 '{"collection": "c", "version": 1, "reports": [[1]], "extra": 1}',
                 '{"collection": "c", "version": 1, "reports": [[-1]]}',
                 '{"collection": "c", "version": 1, "reports": [[1]], "format": 9}']:
        with pytest.raises(DecodeError) as ei:
            batch_from_json(text)
        assert ei.value.reason == "malformed", text
    b = batch_from_json('{"collection": "c", "version": 1, "reports": [[1, 2]], "sent_at": 5}')
    assert b.reports.tolist() == [[1, 2]] and b.sent_at == 5.0 and b.device_ids is None


def test_dlq_record():
    payload = bytes(range(256)) * 300  # 76.8 KB > 64 KiB
    rec = json.loads(dlq_record("truncated", "short", collection=None, topic="ldp.reports.adult",
                                partition=2, offset=99, payload=payload, received_at=5.0))
    assert rec["reason"] == "truncated" and rec["detail"] == "short" and rec["collection"] is None
    assert (rec["topic"], rec["partition"], rec["offset"], rec["received_at"]) == \
        ("ldp.reports.adult", 2, 99, 5.0)
    assert base64.b64decode(rec["payload_b64"]) == payload[:DLQ_PAYLOAD_LIMIT]
    assert rec["payload_bytes"] == len(payload)


def test_decode_is_vectorized_and_fast(capsys):
    import time
    rng = np.random.default_rng(1)
    rep = rng.integers(0, 16, size=(100_000, 8))
    known = {"adult": {1: rr_ind([16] * 8)}}
    t = time.perf_counter()
    blob = encode_batch("adult", 1, rep, device_ids=np.arange(100_000))
    enc = time.perf_counter() - t
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        b = decode_batch(blob, max_bytes=len(blob))
        assert check_batch(b, known) is None
        best = min(best, time.perf_counter() - t)
    assert best < 0.5, best  # ~ms in practice; a per-report loop would take far longer
    assert isinstance(b, ReportBatch)
    with capsys.disabled():
        print(f"\n[codec] 100,000 reports x 8 fields + device ids ({len(blob) / 1e6:.1f} MB): "
              f"encode {enc * 1e3:.1f} ms, decode+check {best * 1e3:.2f} ms "
              f"({100_000 / best / 1e6:.0f}M reports/s)")


def test_uniform_fast_decode_matches_the_codec():
    """The many-messages decode path (the worker's fast path) gives exactly what decode_batch
    gives per message, and refuses anything that is not uniform."""
    rng = np.random.default_rng(1)
    for n, width, hi, ids in ((1, 8, 9, True), (3, 4, 300, False), (2, 2, 70_000, True)):
        reps = [rng.integers(0, hi, size=(n, width)) for _ in range(40)]
        for r in reps:  # the same value dtype in every message
            r[0, 0] = hi - 1
        vals = [encode_batch("c1", 5, r, device_ids=rng.integers(0, 2**63, n) if ids else None,
                             sent_at=1000.0 + i) for i, r in enumerate(reps)]
        fast = decode_uniform(vals, 1 << 20)
        slow = [decode_batch(v) for v in vals]
        assert fast is not None and fast.collection == "c1" and fast.version == 5
        np.testing.assert_array_equal(fast.reports, np.concatenate([b.reports for b in slow]))
        assert fast.sent_at == 1039.0
    one = encode_batch("c1", 5, np.ones((1, 3), int))
    assert decode_uniform([one, encode_batch("c1", 6, np.ones((1, 3), int))], 1 << 20) is None
    assert decode_uniform([one, encode_batch("c2", 5, np.ones((1, 3), int))], 1 << 20) is None
    assert decode_uniform([one, one[:-1] + b"\x07"], 1 << 20) is not None  # values differ: fine
    assert decode_uniform([one, b"X" + one[1:]], 1 << 20) is None          # header differs
    assert decode_uniform([one, one[:-1]], 1 << 20) is None                # length differs
    assert decode_uniform([one[:-1], one[:-1]], 1 << 20) is None           # truncated
    assert decode_uniform([one, one], len(one) - 1) is None                # oversized
    bad_time = bytearray(one)
    bad_time[11 + 2:19 + 2] = np.array([np.nan]).tobytes()
    assert decode_uniform([one, bytes(bad_time)], 1 << 20) is None
    assert decode_uniform([], 1 << 20) is None and decode_uniform([None, one], 1 << 20) is None


def test_uniform_decode_never_disagrees_with_decode_batch():
    """Seeded mutations of uniform message lists (a flipped byte anywhere, header included): the
    fast path either declines (None) or returns exactly the per-message decode."""
    rng = np.random.default_rng(7)
    declined = agreed = 0
    for trial in range(300):
        n, width = int(rng.integers(1, 3)), int(rng.integers(1, 5))
        vals = [encode_batch("cø", 3, rng.integers(0, 200, size=(n, width)),
                             device_ids=np.arange(n) if trial % 2 else None,
                             sent_at=float(i)) for i in range(int(rng.integers(2, 20)))]
        k = int(rng.integers(0, len(vals)))
        msg = bytearray(vals[k])
        msg[int(rng.integers(0, len(msg)))] ^= 1 << int(rng.integers(0, 8))
        vals[k] = bytes(msg)
        fast = decode_uniform(vals, 1 << 20)
        if fast is None:
            declined += 1
            continue
        slow = [decode_batch(v) for v in vals]  # accepted → every message decodes on its own
        assert all(b.collection == fast.collection and b.version == fast.version for b in slow)
        np.testing.assert_array_equal(fast.reports, np.concatenate([b.reports for b in slow]))
        assert fast.sent_at == max(b.sent_at for b in slow)
        agreed += 1
    assert declined > 30 and agreed > 30  # both branches exercised

