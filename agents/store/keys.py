"""Every Redis key of ldpstream, named in one place (docs/windows.md, "Where the counts live").

The count key space is (collection, Kafka partition, mechanism version, time bucket). A *shard* is
one (collection, partition): its keys share the hash tag ``{<collection>#<partition>}``, so the
apply of one partition's delta is one Lua call on one Redis Cluster slot and a collection spreads
over the cluster's masters. Keys of the collection as a whole (leases, locks, controller state)
carry ``{<collection>}``; each estimate (collection, window, method, marginal) has its own tag, so
that no slot is hot::

    ldp:{<cid>#<p>}:off                                   hash: offset, n (reports counted),
                                                          reset_until (a reset holds applies), ...
    ldp:{<cid>#<p>}:sent_at_max                           newest sent_at counted on the shard
    ldp:{<cid>#<p>}:c:<layout>:<v>:<level>:<bucket>:<chunk>
                                                          int64 big-endian cells (BITFIELD): every
                                                          tensor of version <v> concatenated, cell 0
                                                          = reports counted in that bucket
    ldp:{<cid>#<p>}:x:<name>                              side keys: breaker, device state logs
    ldp:{<cid>#<p>}:x:<name>:<b>                          per-device side hashes, bucket <b> of window
                                                          <name> = dedupe:<w> (agents/store/dedupe.py),
                                                          quota:<w> (agents/store/quota.py), budget:<w>;
                                                          few fields each (listpack-encoded:
                                                          agents/store/side_buckets.py)
    ldp:{<cid>#<p>}:x:<name>:m                            hash: b (the window's buckets), n (fields)
    ldp:{<cid>#<p>}:x:<name>                              the window's single hash of earlier versions,
                                                          still read until it expires
    ldp:{<cid>}:<what>                                    collection-wide (leases, locks, controller)
    ldp:{<cid>|<window>|<method>|<marginal>}:est          latest estimate (JSON)

Collection ids match ``[A-Za-z0-9][A-Za-z0-9_.-]*`` (config.py), so ``#``, ``|``, ``{`` and ``}``
never occur inside them.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["LEVEL_FINE", "LEVEL_COARSE", "LEVEL_ALL", "LEVELS", "shard_prefix", "offsets_key",
           "sent_at_key", "counts_key", "side_key", "side_bucket_name", "side_meta_name",
           "collection_key", "acks_taken_key",
           "estimate_key",
           "collection_patterns", "glob_escape"]

LEVEL_FINE = "f"      # one bucket of ``bucket_s`` seconds
LEVEL_COARSE = "h"    # one bucket of ``COARSE_FACTOR * bucket_s`` seconds (ldpstream/windows.py)
LEVEL_ALL = "a"       # all time (bucket 0)
LEVELS = (LEVEL_FINE, LEVEL_COARSE, LEVEL_ALL)


def shard_prefix(collection: str, partition: int) -> str:
    """``ldp:{<collection>#<partition>}``: every key of one shard starts with it (one slot)."""
    return "ldp:{%s#%d}" % (collection, int(partition))


def offsets_key(collection: str, partition: int) -> str:
    return shard_prefix(collection, partition) + ":off"


def sent_at_key(collection: str, partition: int) -> str:
    return shard_prefix(collection, partition) + ":sent_at_max"


def counts_key(collection: str, partition: int, layout: str, version: int, level: str,
               bucket: int, chunk: int) -> str:
    return (f"{shard_prefix(collection, partition)}:c:{layout}:{int(version)}:{level}:"
            f"{int(bucket)}:{int(chunk)}")


def side_key(collection: str, partition: int, name: str) -> str:
    return f"{shard_prefix(collection, partition)}:x:{name}"


def side_bucket_name(name: str, bucket: int) -> str:
    """The side name of bucket ``bucket`` of the per-device side hash ``name`` of a window."""
    return f"{name}:{int(bucket)}"


def side_meta_name(name: str) -> str:
    """The side name of the meta hash (fields ``b`` and ``n``) of per-device side hash ``name``."""
    return f"{name}:m"


def collection_key(collection: str, what: str) -> str:
    """A collection-wide key (``refresh_lease``, ``refresh_lock``, controller state ...)."""
    return "ldp:{%s}:%s" % (collection, what)


def acks_taken_key(collection: str) -> str:
    """Hash fleet → reports of device-authenticated batches the workers took (agents/ingest/acks.py)."""
    return collection_key(collection, "acks:taken")


def estimate_key(collection: str, window: str, method: str, attrs: Sequence[str]) -> str:
    return "ldp:{%s|%s|%s|%s}:est" % (collection, window, method, "|".join(attrs))


def glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def collection_patterns(collection: str) -> list[str]:
    """SCAN patterns matching every key of ``collection`` (shards, collection-wide, estimates)."""
    c = glob_escape(collection)
    return [f"ldp:{{{c}#*", f"ldp:{{{c}}}:*", f"ldp:{{{c}|*"]
