"""The store: what enters is a partition's delta (counts, offsets, per-device side counters:
:mod:`.apply_delta`), checked and clamped first (:mod:`.apply_guard`); what leaves is Redis state
applied exactly once by one compare-and-set script per partition (:mod:`.count_store`,
:mod:`.scripts`), read back by the refresh. Every Redis key is named in :mod:`.keys`; the
per-device rules that run inside the apply (quotas, batch dedupe, memoized devices) and the
lease that lets one worker refresh a collection live here too (docs/pipeline.md "Exactly-once
counting", docs/windows.md "Where the counts live")."""
