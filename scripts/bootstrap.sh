#!/usr/bin/env bash
# Install everything ldpstream needs on a fresh Debian machine: Debian packages (redis-server,
# prometheus (promtool, and `up --obs`) with prometheus-alertmanager, chromium and chromium-driver for the page's browser test, Java and Maven
# for the Apache Kafka test broker, the C SDK's compiler and libraries, Node.js for the TypeScript
# SDK), a virtualenv in .venv, the project with its extras, and the Apache Kafka jars
# (ldpstream/data/kafka-pom.xml). Idempotent; says what it is doing.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'bootstrap: %s\n' "$*"; }
APT_PACKAGES="redis-server prometheus prometheus-alertmanager chromium chromium-driver mosquitto mosquitto-clients"
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
# `ldpstream up --obs` runs Alertmanager beside Prometheus (ldpstream/dev/observability.py)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing="$missing prometheus-alertmanager"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -x /usr/bin/chromedriver ] || missing="$missing chromium-driver"
# the C device SDK (sdk/c): compiler, CMake, libsodium, jansson, libcurl (its example)
command -v cmake >/dev/null 2>&1 || missing="$missing cmake"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
# (native architecture named: with the i386 copies below installed, a bare name is ambiguous)
arch=$(dpkg --print-architecture)
for dev in libsodium-dev libjansson-dev libcurl4-openssl-dev; do
  dpkg -s "$dev:$arch" >/dev/null 2>&1 || missing="$missing $dev"
done
# the C SDK's fuzz target (clang with libFuzzer) and its 32-bit firmware build (gcc-multilib,
# the i386 libsodium and jansson: the i386 architecture is added to dpkg when missing)
command -v clang >/dev/null 2>&1 || missing="$missing clang"
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || missing="$missing libclang-rt-14-dev"
dpkg -s gcc-multilib >/dev/null 2>&1 || missing="$missing gcc-multilib"
for dev in libsodium-dev:i386 libjansson-dev:i386; do
  dpkg -s "$dev" >/dev/null 2>&1 || missing="$missing $dev"
done
# the C SDK's MQTT example (sdk/c/examples/mqtt.c)
dpkg -s libmosquitto-dev >/dev/null 2>&1 || missing="$missing libmosquitto-dev"
# the TypeScript device SDK (sdk/ts)
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
command -v java >/dev/null 2>&1 || missing="$missing openjdk-17-jre-headless"
command -v mvn >/dev/null 2>&1 || missing="$missing maven"
# the MQTT broker of the embedded stack and the MQTT tests (ldpstream/dev/mosquitto.py)
[ -x /usr/sbin/mosquitto ] || missing="$missing mosquitto"
command -v mosquitto_passwd >/dev/null 2>&1 || missing="$missing mosquitto-clients"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  say "Debian packages:$missing (apt-get update + install, about a minute)"
  case "$missing" in
    *:i386*) dpkg --print-foreign-architectures | grep -qx i386 || $SUDO dpkg --add-architecture i386 ;;
  esac
  # a mirror caught mid-sync fails one index ("File has unexpected size") and apt-get update
  # exits 100 although the other lists were read: try again, then let the install decide (it
  # fails, naming the package, only when what it needs is not in the lists it has)
  for attempt in 1 2 3; do
    $SUDO apt-get update -q && break
    if [ "$attempt" -eq 3 ]; then
      say "apt-get update failed 3 times; installing from the package lists it could read"
    else
      say "apt-get update failed (attempt $attempt of 3); trying again in $((attempt * 10)) s"
      sleep $((attempt * 10))
    fi
  done
  $SUDO apt-get install -y -q --no-install-recommends $missing
  # the Debian packages start system services; ldpstream starts its own on free ports
  for svc in redis-server prometheus prometheus-alertmanager prometheus-node-exporter mosquitto; do
    $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || $SUDO service "$svc" stop >/dev/null 2>&1 || true
  done
else
  say "Debian packages present ($APT_PACKAGES)"
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || { say "creating the virtualenv .venv"; "$PY" -m venv .venv; }
stamp=.venv/.ldpstream-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing ldpstream and its Python dependencies into .venv (about a minute on a fresh machine)"
  .venv/bin/pip install -q -U pip
  .venv/bin/pip install -q -e ".[embedded,test]"
  touch "$stamp"
  say "done: .venv/bin/ldpstream is installed"
else
  say ".venv is up to date (delete $stamp to reinstall)"
fi
# the TypeScript device SDK's pinned dependencies (package-lock.json)
if [ ! -d sdk/ts/node_modules ] || [ sdk/ts/package-lock.json -nt sdk/ts/node_modules ]; then
  (cd sdk/ts && npm ci --no-audit --no-fund --loglevel=error)
fi
# the Apache Kafka jars the tests' second broker runs from (ldpstream/dev/kafka.py; cached once)
if ! .venv/bin/python -c "from ldpstream.dev.kafka import kafka_jars_dir, KAFKA_VERSION; import sys; sys.exit(not (kafka_jars_dir() / f'kafka_2.13-{KAFKA_VERSION}.jar').is_file())"; then
  say "fetching Apache Kafka's jars with Maven (once, into ~/.cache/ldpstream; a minute or two, quiet while it downloads)"
fi
.venv/bin/python -c "from ldpstream.dev.kafka import ensure_kafka_jars; ensure_kafka_jars()"
