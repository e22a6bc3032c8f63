# The two commands of the README: `make up` (install, then run the embedded stack) and `make test`.
.PHONY: install up test bench

install:
	./scripts/bootstrap.sh

up: install
	.venv/bin/ldpstream up

test: install
	.venv/bin/python -m pytest -q tests

bench: install
	.venv/bin/ldpstream bench castell && .venv/bin/ldpstream bench adult
