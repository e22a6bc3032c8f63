"""The embedded dev stack (no Docker): Redis, a Redis Cluster and a Kafka-protocol broker run as
child processes on loopback ports, for ``ldpstream up``, the tests and the benchmarks
(docs/configuration.md, "Embedded services"). Production talks to real services instead."""
