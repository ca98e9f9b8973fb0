"""``kafka.security`` mapped once onto the two Kafka clients the project runs: librdkafka
(every Python client, built in :mod:`substreams.kafka.client`) and the Java client (Spark's
Kafka source, whose settings are ``kafka.``-prefixed options).

Why here and only here: a secured cluster refuses a client that gets one key wrong, and the
two clients name the same thing differently (``sasl.mechanisms`` / ``sasl.mechanism``,
``ssl.ca.location`` / ``ssl.truststore.location``, a password key / a JAAS line).  The
password is read when a client is built, from the environment or a file, and appears in no
error, log line or repr: :class:`Secret` hides it from everything but the client.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from substreams.config.model import ClientValue, SecurityConfig
from substreams.errors import SubstreamsError

__all__ = [
    "JAVA_FROM_RDKAFKA",
    "Secret",
    "java_options",
    "password",
    "rdkafka_settings",
    "unmapped_client_keys",
]

SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


class Secret(str):
    """A password: a ``str`` for the client that needs one, ``'***'`` in any repr."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def password(sec: SecurityConfig) -> Secret:
    """The password ``sec`` points at; a :class:`SubstreamsError` naming the variable or
    file (never a value) when it is not there."""
    if sec.password_env is not None:
        value = os.environ.get(sec.password_env)
        if not value:
            raise SubstreamsError(
                f"kafka.security.password_env: environment variable {sec.password_env} is "
                f"not set (the password of Kafka user '{sec.username}')"
            )
        return Secret(value)
    if sec.password_file is not None:
        try:
            text = Path(sec.password_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise SubstreamsError(
                f"kafka.security.password_file: cannot read {sec.password_file}: "
                f"{exc.strerror}"
            ) from None
        value = text.splitlines()[0] if text else ""
        if not value:
            raise SubstreamsError(f"kafka.security.password_file: {sec.password_file} is empty")
        return Secret(value)
    raise SubstreamsError("kafka.security: no password_env nor password_file")


def rdkafka_settings(sec: SecurityConfig | None) -> dict[str, Any]:
    """librdkafka's keys for ``sec`` (empty for None: the client's PLAINTEXT default)."""
    if sec is None:
        return {}
    out: dict[str, Any] = {"security.protocol": sec.protocol}
    if sec.sasl:
        out["sasl.mechanisms"] = sec.sasl_mechanism
        out["sasl.username"] = sec.username
        out["sasl.password"] = password(sec)
    if sec.tls:
        if sec.ca_file is not None:
            out["ssl.ca.location"] = sec.ca_file
        out["ssl.endpoint.identification.algorithm"] = "https" if sec.check_hostname else "none"
    return out


def _jaas(mechanism: str, username: str, secret: str) -> str:
    module = PLAIN_MODULE if mechanism == "PLAIN" else SCRAM_MODULE

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"{module} required username={quoted(username)} password={quoted(secret)};"


def java_options(sec: SecurityConfig | None) -> dict[str, str]:
    """Spark's Kafka source options (``kafka.<Java client key>``) for ``sec``.  The JAAS
    line holds the password: the JVM read hands these to the executor consumers' settings
    and into no plan; passed to ``spark.read.format("kafka")`` by a user, Spark's
    ``spark.redaction.regex`` (values matching ``password``) hides it in plans and the UI,
    and the Java client logs it as ``[hidden]`` (a PASSWORD-type setting)."""
    if sec is None:
        return {}
    out: dict[str, str] = {"kafka.security.protocol": sec.protocol}
    if sec.sasl:
        assert sec.username is not None  # the loader's rule
        out["kafka.sasl.mechanism"] = sec.sasl_mechanism
        out["kafka.sasl.jaas.config"] = _jaas(sec.sasl_mechanism, sec.username, password(sec))
    if sec.tls:
        if sec.ca_file is not None:
            out["kafka.ssl.truststore.type"] = "PEM"
            out["kafka.ssl.truststore.location"] = sec.ca_file
        if not sec.check_hostname:
            out["kafka.ssl.endpoint.identification.algorithm"] = ""
    return out


JAVA_FROM_RDKAFKA: Mapping[str, str] = {
    "security.protocol": "security.protocol",
    "sasl.mechanisms": "sasl.mechanism",
    "sasl.mechanism": "sasl.mechanism",
    "ssl.ca.location": "ssl.truststore.location",
    "ssl.endpoint.identification.algorithm": "ssl.endpoint.identification.algorithm",
}
"""librdkafka security keys of ``kafka.client`` the Java client takes under another name
(``sasl.username``/``sasl.password`` become its JAAS line)."""

_JAVA_SECRETS = ("sasl.username", "sasl.password")


def unmapped_client_keys(client: Mapping[str, ClientValue]) -> list[str]:
    """The ``kafka.client`` keys :func:`java_client_options` cannot give the Java client."""
    return sorted(k for k in client if k not in JAVA_FROM_RDKAFKA and k not in _JAVA_SECRETS)


def java_client_options(client: Mapping[str, ClientValue]) -> dict[str, str]:
    """The security keys of ``kafka.client`` (librdkafka names) as Spark's Kafka source
    options; call only when :func:`unmapped_client_keys` is empty."""
    out: dict[str, str] = {}
    for key, value in client.items():
        java = JAVA_FROM_RDKAFKA.get(key)
        if java is None:
            continue
        if java == "ssl.truststore.location":
            out["kafka.ssl.truststore.type"] = "PEM"
        if java == "ssl.endpoint.identification.algorithm" and value == "none":
            value = ""
        out[f"kafka.{java}"] = str(value)
    if "sasl.username" in client:
        mechanism = str(client.get("sasl.mechanisms", client.get("sasl.mechanism", "PLAIN")))
        out["kafka.sasl.jaas.config"] = _jaas(
            mechanism, str(client["sasl.username"]), str(client.get("sasl.password", ""))
        )
    return out
