#!/usr/bin/env bash
# Install everything ldpstream needs on a fresh Debian machine: Debian packages (redis-server,
# prometheus for promtool, Java and Maven for the Apache Kafka test broker), a virtualenv in .venv,
# the project with its extras, and the Apache Kafka jars (tests/kafka/pom.xml). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
APT_PACKAGES="redis-server prometheus"
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v java >/dev/null 2>&1 || missing="$missing openjdk-17-jre-headless"
command -v mvn >/dev/null 2>&1 || missing="$missing maven"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends $missing
  # the Debian packages start system services; ldpstream starts its own on free ports
  for svc in redis-server prometheus prometheus-node-exporter; do
    $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || $SUDO service "$svc" stop >/dev/null 2>&1 || true
  done
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.ldpstream-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q -U pip
  .venv/bin/pip install -q -e ".[embedded,test]"
  touch "$stamp"
fi
# the Apache Kafka jars the tests' second broker runs from (ldpstream/dev_kafka.py; cached once)
.venv/bin/python -c "from ldpstream.dev_kafka import ensure_kafka_jars; ensure_kafka_jars()"
