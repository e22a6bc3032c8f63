# The two commands of the README: `make up` (install, then run the embedded stack) and `make test`.
.PHONY: install up test test-fast test-pipeline test-kafka bench

install:
	./scripts/bootstrap.sh

up: install
	.venv/bin/ldpstream up

# every test (CI runs this): the core tier on two processes (pure CPU), then the pipeline (real
# Kafka + Redis children) and e2e tiers in one (their timings assume a core to themselves); fails
# if either run fails, after both ran
test: install
	rc=0; .venv/bin/python -m pytest -q -n 2 -m core --durations=10 tests || rc=1; \
	.venv/bin/python -m pytest -q -m "not core" --durations=30 tests || rc=1; exit $$rc

# the pure core (estimators, codec, config, CLI), no services: under a minute
test-fast: install
	.venv/bin/python -m pytest -q -m "core and not slow" tests

# the tests that need Kafka and Redis (started on loopback by the fixtures)
test-pipeline: install
	.venv/bin/python -m pytest -q -m pipeline tests

# the Apache Kafka leg alone (JVM brokers started by the fixtures; part of `make test`)
test-kafka: install
	.venv/bin/python -m pytest -q -m kafka --durations=20 tests

bench: install
	.venv/bin/ldpstream bench castell && .venv/bin/ldpstream bench adult
