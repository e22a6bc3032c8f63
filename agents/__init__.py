"""The Faust app: ingest agents, Redis count store, refresh timers, controllers, HTTP views, metrics."""
