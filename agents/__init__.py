"""The worker (``ldpstream worker``), in stages as the data flows (docs/architecture.md):

- :mod:`.ingest`: report batches from Kafka → checked, gated, counted deltas → Redis and ``ldp.dlq``;
- :mod:`.store`: the Redis side: keys, count layout, the exactly-once apply and its per-device rules;
- :mod:`.refresh`: window counts from Redis → estimates, bounds and drift back in Redis;
- :mod:`.control`: the mechanism in force, ``ldp.config`` and the adaptive controller;
- :mod:`.serve`: the HTTP API, the live page and ``/metrics``.

:mod:`.context` (configuration and connections) and :mod:`.metrics` sit below every stage;
:mod:`.worker` holds the assembled parts and :mod:`.app` wires them into the faust app.
"""
