"""TLS and SASL for every Kafka client of ldpstream, from the environment (one place).

Every client (the worker's consumer and producer and its faust app, the topic admin, devices'
:class:`~.publisher.Publisher` and :class:`~.device.ConfigWatcher`, the fleet, the gateway) takes
its connection security from :func:`kafka_security` and passes :meth:`KafkaSecurity.client_kwargs`
to aiokafka. Variables (docs/security.md):

=================================  ======================================================
``LDP_KAFKA_SECURITY_PROTOCOL``    ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``
``LDP_KAFKA_SSL_CAFILE``           CA bundle that signed the brokers' certificates (TLS)
``LDP_KAFKA_SSL_CERTFILE`` / ``_KEYFILE``  client certificate and key (mutual TLS), optional
``LDP_KAFKA_SSL_CHECK_HOSTNAME``   ``true`` (default) / ``false``
``LDP_KAFKA_SASL_MECHANISM``       ``PLAIN``, ``SCRAM-SHA-256`` (default for SASL), ``SCRAM-SHA-512``
``LDP_KAFKA_SASL_USERNAME``        the principal (e.g. ``worker`` or ``device``)
``LDP_KAFKA_SASL_PASSWORD`` / ``_FILE``  its password, or a file holding it
=================================  ======================================================
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["KafkaSecurity", "KafkaSecurityError", "kafka_security", "PROTOCOLS", "MECHANISMS"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_PREFIX = "LDP_KAFKA_"


class KafkaSecurityError(ValueError):
    """An unusable Kafka security setting (the message names the variable)."""


@dataclass(frozen=True)
class KafkaSecurity:
    """How clients authenticate to the brokers and encrypt the connection."""

    protocol: str = "PLAINTEXT"
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.cafile)
        ctx.check_hostname = self.check_hostname
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaProducer`` / ``AIOKafkaConsumer`` /
        ``AIOKafkaAdminClient``."""
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            out["ssl_context"] = self.ssl_context()
        if self.sasl:
            out.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username,
                       sasl_plain_password=self.password)
        return out

    def faust_credentials(self) -> Any:
        """The faust ``broker_credentials`` for the same settings (None for PLAINTEXT)."""
        import faust

        if self.sasl:
            return faust.SASLCredentials(username=self.username, password=self.password,
                                         mechanism=self.sasl_mechanism,
                                         ssl_context=self.ssl_context())
        if self.tls:
            return faust.SSLCredentials(self.ssl_context())
        return None

    def describe(self) -> str:
        who = f" as {self.username!r} ({self.sasl_mechanism})" if self.sasl else ""
        return f"{self.protocol}{who}"


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise KafkaSecurityError(f"{name}: expected true or false, got {raw!r}")


def _file(env: Mapping[str, str], name: str) -> str | None:
    path = env.get(name) or None
    if path is not None and not os.path.isfile(path):
        raise KafkaSecurityError(f"{name}={path!r}: no such file")
    return path


def kafka_security(environ: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The settings in ``environ`` (default ``os.environ``), validated: an unknown protocol or
    mechanism, a missing file or a SASL protocol without credentials raise
    :class:`KafkaSecurityError` naming the variable."""
    env = os.environ if environ is None else environ
    protocol = (env.get(_PREFIX + "SECURITY_PROTOCOL") or "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise KafkaSecurityError(f"{_PREFIX}SECURITY_PROTOCOL: {protocol!r} is not one of "
                                 f"{', '.join(PROTOCOLS)}")
    certfile = _file(env, _PREFIX + "SSL_CERTFILE")
    keyfile = _file(env, _PREFIX + "SSL_KEYFILE")
    if keyfile and not certfile:
        raise KafkaSecurityError(f"{_PREFIX}SSL_KEYFILE needs {_PREFIX}SSL_CERTFILE")
    sec: dict[str, Any] = dict(protocol=protocol, cafile=_file(env, _PREFIX + "SSL_CAFILE"),
                               certfile=certfile, keyfile=keyfile,
                               check_hostname=_flag(env, _PREFIX + "SSL_CHECK_HOSTNAME", True))
    if protocol.startswith("SASL_"):
        mechanism = (env.get(_PREFIX + "SASL_MECHANISM") or "SCRAM-SHA-256").upper()
        if mechanism not in MECHANISMS:
            raise KafkaSecurityError(f"{_PREFIX}SASL_MECHANISM: {mechanism!r} is not one of "
                                     f"{', '.join(MECHANISMS)}")
        username = env.get(_PREFIX + "SASL_USERNAME")
        password = env.get(_PREFIX + "SASL_PASSWORD")
        pw_file = _file(env, _PREFIX + "SASL_PASSWORD_FILE")
        if not password and pw_file:
            password = Path(pw_file).read_text().strip()
        if not username or not password:
            raise KafkaSecurityError(f"{_PREFIX}SECURITY_PROTOCOL={protocol} needs "
                                     f"{_PREFIX}SASL_USERNAME and {_PREFIX}SASL_PASSWORD(_FILE)")
        sec.update(sasl_mechanism=mechanism, username=username, password=password)
    return KafkaSecurity(**sec)
