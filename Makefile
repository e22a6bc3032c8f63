# The two commands of the README: `make up` (install, then run the embedded stack) and `make test`.
# `make up ARGS="--web-port 6067 --rate 500"` passes options to `ldpstream up`; MQTT=1 adds
# Mosquitto and the bridge, OBS=1 Prometheus and Alertmanager with the alert rules.
.PHONY: install up check test test-fast test-pipeline test-sdk test-kafka bench

install:
	./scripts/bootstrap.sh

up: install
	.venv/bin/ldpstream up$(if $(MQTT), --mqtt)$(if $(OBS), --obs) $(ARGS)

# lint and import order (ruff, rules in pyproject.toml), then types (mypy over agents/,
# producers/ and ldpstream/ as the package ldpstream.*, scripts/typecheck.sh)
check: install
	.venv/bin/ruff check .
	./scripts/typecheck.sh

# every test (CI runs this): the checks, the device SDKs, the core tier on two processes (pure
# CPU), then the pipeline (real Kafka + Redis children) and e2e tiers on two processes, a module's
# tests together (its services are started once); no test assumes a time for a start, they wait
# for the service to say it is ready; every step runs, and any failing fails
test: install
	rc=0; $(MAKE) --no-print-directory check || rc=1; \
	$(MAKE) --no-print-directory test-sdk || rc=1; \
	.venv/bin/python -m pytest -q -n 2 -m core --durations=10 tests || rc=1; \
	.venv/bin/python -m pytest -q -n 2 --dist loadscope -m "not core" --durations=30 tests \
	  || rc=1; exit $$rc

# the device SDKs (docs/device-protocol.md): the C library with warnings as errors and
# -fsanitize=address,undefined (unit tests and the conformance suite under ctest), a Release
# build that counts allocations on the report path (none allowed), the firmware profile built
# for a 32-bit target (-m32: layers, unit, conformance, no heap on the report path nor while a
# state is accepted), the parser's libFuzzer target (clang, ASan + UBSan) for FUZZ_SECONDS, then
# the TypeScript package (tsc, node --test on the same conformance files)
FUZZ_SECONDS ?= 25
test-sdk: install
	cmake -S sdk/c -B sdk/c/build -DLDP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build sdk/c/build -j2
	cd sdk/c/build && ctest --output-on-failure
	cmake -S sdk/c -B sdk/c/build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build sdk/c/build-release -j2 --target test_noheap
	cd sdk/c/build-release && ctest --output-on-failure -R no_heap
	cmake -S sdk/c -B sdk/c/build-fw32 -DCMAKE_BUILD_TYPE=Release -DLDP_FIRMWARE=ON \
	  -DLDP_M32=ON -DLDP_EXAMPLES=OFF >/dev/null
	cmake --build sdk/c/build-fw32 -j2
	cd sdk/c/build-fw32 && ctest --output-on-failure
	cmake -S sdk/c -B sdk/c/build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
	  -DLDP_SANITIZE=ON -DLDP_FUZZ=ON -DLDP_EXAMPLES=OFF -DLDP_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build sdk/c/build-fuzz -j2 --target fuzz_parse
	cd sdk/c/build-fuzz && ctest --output-on-failure -R fuzz_parse
	cd sdk/ts && npm test

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
