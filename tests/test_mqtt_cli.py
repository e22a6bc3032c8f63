"""``ldpstream mqtt-bridge`` refuses a bad start with one line naming the option or field, and the
pure parts of MQTT ingress: broker URLs, the batch form of a message, the fleets file without
tokens."""
from __future__ import annotations

import json

import paho.mqtt.client as paho
import pytest

from ldpstream.cli import main
from ldpstream.errors import CliError
from ldpstream.mqtt_client import parse_mqtt_url
from ldpstream.producers.mqtt_bridge import content_type, load_mqtt_fleets

pytestmark = pytest.mark.core


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in ("LDP_MQTT_URL", "LDP_MQTT_CA", "LDP_MQTT_FLEETS_FILE", "LDP_MQTT_SUBSCRIPTION",
                 "LDP_MQTT_BROKER_LOG_FILE", "LDP_CONFIG_PUBLIC_KEY", "LDP_CONFIG_PUBLIC_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    fleets = tmp_path / "fleets.yaml"
    fleets.write_text("fleets:\n  phones: {collections: [c1]}\n")
    return monkeypatch, fleets


def refusal(capsys, argv) -> str:
    assert main(["mqtt-bridge", *argv]) == 2
    return capsys.readouterr().err


def test_bridge_start_refusals_name_the_setting(env, capsys, tmp_path):
    monkeypatch, fleets = env
    assert "no MQTT broker" in refusal(capsys, [])
    assert "--mqtt-url" in refusal(capsys, ["--mqtt-url", "http://u:secret@host:1883"])
    err = refusal(capsys, ["--mqtt-url", "mqtt://u:secret@host:port"])
    assert "port" in err and "secret" not in err
    url = ["--mqtt-url", "mqtt://u:p@127.0.0.1:1"]
    assert "no fleets" in refusal(capsys, url)
    assert "--mqtt-ca" in refusal(capsys, [*url, "--mqtt-ca", str(tmp_path / "none.pem"),
                                           "--fleets", str(fleets)])
    bad = tmp_path / "bad.yaml"
    bad.write_text("fleets:\n  phones: {collections: 7}\n")
    assert "fleets.phones.collections" in refusal(capsys, [*url, "--fleets", str(bad)])
    assert "no public key pinned" in refusal(capsys, [*url, "--fleets", str(fleets)])
    from ldpstream.producers.signing import SigningKey
    monkeypatch.setenv("LDP_CONFIG_PUBLIC_KEY", SigningKey.generate().verify_key.to_text())
    monkeypatch.setenv("LDP_MQTT_SUBSCRIPTION", "everyone")
    assert "LDP_MQTT_SUBSCRIPTION" in refusal(capsys, [*url, "--fleets", str(fleets)])
    monkeypatch.delenv("LDP_MQTT_SUBSCRIPTION")
    missing = str(tmp_path / "mosquitto.log")
    assert "--broker-log" in refusal(capsys, [*url, "--fleets", str(fleets), "--broker-log", missing])
    monkeypatch.setenv("LDP_MQTT_BROKER_LOG_FILE", missing)
    assert "LDP_MQTT_BROKER_LOG_FILE" in refusal(capsys, [*url, "--fleets", str(fleets)])
    monkeypatch.delenv("LDP_MQTT_BROKER_LOG_FILE")
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS")
    assert "KAFKA_BOOTSTRAP_SERVERS" in refusal(capsys, url)


def test_urls_fleets_and_batch_forms(tmp_path):
    ep = parse_mqtt_url("mqtts://bridge%40x:p%3Ass@mqtt.example")
    assert (ep.host, ep.port, ep.tls, ep.username, ep.password) == \
        ("mqtt.example", 8883, True, "bridge@x", "p:ss")
    assert "p:ss" not in str(ep) and parse_mqtt_url("mqtt://h").port == 1883
    with pytest.raises(CliError, match="mqtt://"):
        parse_mqtt_url("tcp://h:1")
    # the gateway's tokens file works as the bridge's fleets file; tokens are optional
    both = tmp_path / "tokens.json"
    both.write_text(json.dumps({"fleets": {"a": {"token": "t" * 16, "collections": "*"},
                                           "b": {"collections": ["c"]}}}))
    fleets = load_mqtt_fleets(str(both))
    assert [(f.name, f.collections) for f in fleets] == [("a", None), ("b", frozenset({"c"}))]
    msg = paho.MQTTMessage(topic=b"ldp/a/c/reports")
    msg.payload = b'{"format": 1}'
    assert content_type(msg) == "application/json"
    msg.payload = b"LDPB..."
    assert content_type(msg) == "application/octet-stream"
