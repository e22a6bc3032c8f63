"""The KRaft controller listener of the secure Apache Kafka fixture refuses clients without the
controllers' own credentials (docs/security.md "Kafka: TLS, SASL and ACLs"): Kafka's
``AclCommand --bootstrap-controller`` run with no credentials (or with a device's) can neither
list nor add ACLs. Before, the listener was PLAINTEXT with its ANONYMOUS principal a super user:
the same command listed every ACL and granted the device principal Write on ``ldp.config``."""
from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = [pytest.mark.pipeline, pytest.mark.kafka]

#: an unauthenticated attempt gives up within this (the tool retries until its API timeout)
ATTEMPT_TIMEOUT_S = 60.0



def acl_command(ctl: str, tmp_path, name: str, props: dict, *args: str) -> tuple[int | None, str]:
    """``AclCommand --bootstrap-controller ctl`` with the client settings ``props`` (no SASL
    unless they carry it); returns (exit code or None when it was still trying at the deadline,
    output)."""
    from ldpstream.dev.kafka import ACLS_TOOL, _jvm, ensure_kafka_jars

    cfg = tmp_path / f"{name}.properties"
    cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    argv = [*_jvm(ensure_kafka_jars(), "128m"), ACLS_TOOL, "--bootstrap-controller", ctl,
            "--command-config", str(cfg), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=ATTEMPT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return None, f"{exc.stdout or ''}{exc.stderr or ''}"
    return proc.returncode, proc.stdout + proc.stderr


#: bounded client timeouts: an attempt that is refused ends instead of retrying for minutes
TIMEOUTS = {"request.timeout.ms": 5000, "default.api.timeout.ms": 15000,
            "socket.connection.setup.timeout.max.ms": 5000}


GRANT = ("--add", "--allow-principal", "User:device", "--operation", "Write",
         "--topic", "ldp.config")


def assert_refused(ctl: str, tmp_path, name: str, props: dict) -> None:
    """Listing and adding ACLs through the controller ``ctl`` with ``props`` both fail."""
    t0 = time.monotonic()
    rc, out = acl_command(ctl, tmp_path, f"{name}-list", props, "--list")
    assert rc != 0, f"{name}: the controller listed the ACLs:\n{out[-2000:]}"
    assert "ldp.config" not in out, f"{name}: ACLs leaked:\n{out[-2000:]}"
    rc, out = acl_command(ctl, tmp_path, f"{name}-add", props, *GRANT)
    assert rc != 0, f"{name}: the controller granted an ACL:\n{out[-2000:]}"
    print(f"{name}: refused in {time.monotonic() - t0:.1f} s (list + add)")


def test_controller_listener_refuses_unauthenticated_acl_changes(secure_kafka, tmp_path):
    kafka = secure_kafka
    ctl = ",".join(f"127.0.0.1:{n.controller_port}" for n in kafka.nodes)
    attempts = {
        # the finding's attack: no credentials at all
        "anonymous": dict(TIMEOUTS),
        # TLS but no SASL, trusting the brokers' CA
        "tls-only": dict(TIMEOUTS, **{"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                                      "ssl.truststore.location": kafka.ca_file}),
        # a device's SCRAM credentials: a client principal, not a controller
        "device": dict(TIMEOUTS, **{
            "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "ssl.truststore.type": "PEM", "ssl.truststore.location": kafka.ca_file,
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                f'required username="device" password="{kafka.device.password}";'}),
    }
    for name, props in attempts.items():
        assert_refused(ctl, tmp_path, name, props)
    # the grant never reached the metadata: the admin sees no Write ACL of the device on it
    listed = kafka.cli("org.apache.kafka.tools.AclCommand", "--list", "--topic", "ldp.config")
    device_lines = [ln for ln in listed.splitlines() if "User:device" in ln]
    assert device_lines and not any("operation=WRITE" in ln for ln in device_lines), listed
