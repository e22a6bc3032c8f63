# The two commands of the README: `make up` (install, then run the embedded stack) and `make test`.
.PHONY: install up test test-fast test-pipeline bench

install:
	./scripts/bootstrap.sh

up: install
	.venv/bin/ldpstream up

# every test (CI runs this): core, pipeline (real Kafka + Redis children) and e2e tiers
test: install
	.venv/bin/python -m pytest -q --durations=30 tests

# the pure core (estimators, codec, config, CLI), no services: under a minute
test-fast: install
	.venv/bin/python -m pytest -q -m "core and not slow" tests

# the tests that need Kafka and Redis (started on loopback by the fixtures)
test-pipeline: install
	.venv/bin/python -m pytest -q -m pipeline tests

bench: install
	.venv/bin/ldpstream bench castell && .venv/bin/ldpstream bench adult
