"""Refresh: what enters is a collection's bucket counts in Redis, summed into each window
(:mod:`.bucket_reader`; memoized collections' previous windows: :mod:`.window_snapshots`); what
leaves is one stored estimate per marginal × estimator × window, with n, ε, bounds and drift
(:mod:`.payloads`, a pure function of the counts), and the estimate gauges, written by the timer
of :mod:`.refresher` (docs/windows.md)."""
