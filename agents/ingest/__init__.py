"""Ingest: what enters is report batches from the ``ldp.reports.<id>`` topics (one aiokafka
consumer, positioned at the offsets stored in Redis, never Kafka's); what leaves is, per
partition, a pending delta of numpy counts with the offsets it covers, applied to Redis exactly
once (:mod:`.applier`), and the refused messages, filed on ``ldp.dlq`` with their reasons
(:mod:`.dlq_writer`). On the way: decode and validate (:mod:`.intake`), the per-device gates
(quota and daily ε budget, idempotent batches, memoized devices: ``*_gate``), the log-identity
check, rebalances and the poison-pill breaker (docs/pipeline.md, "The worker's parts")."""
