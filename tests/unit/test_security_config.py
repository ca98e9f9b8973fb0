"""``kafka.security``: the loader's rules (file, line, key), the one mapping onto librdkafka's
and the Java client's keys, and no password in any repr, pickle or error."""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pytest

from substreams.config import Config, load_config
from substreams.config.model import SecurityConfig
from substreams.errors import ConfigError, SubstreamsError
from substreams.kafka import security
from substreams.spark.jvm_read import jvm_unsupported, security_options

SECRET = "s3cr\"et\\pw"


def write(tmp_path: Path, kafka: str) -> Path:
    (tmp_path / "e.avsc").write_text(json.dumps({
        "type": "record", "name": "E", "fields": [{"name": "ts", "type": "long"}]}))
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    path = tmp_path / "substreams.yaml"
    path.write_text(textwrap.dedent(kafka) + "streams:\n  - {name: e, schema: e.avsc, "
                    "order_key: ts}\n")
    return path


GOOD = """\
kafka:
  bootstrap: broker:9093
  security:
    protocol: SASL_SSL
    username: pub
    password_env: KAFKA_PW
    ca_file: ca.pem
"""


def test_a_block_loads_with_its_files_resolved_and_no_secret_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_PW", SECRET)
    config = load_config(write(tmp_path, GOOD))
    sec = config.kafka.security
    assert sec == SecurityConfig(username="pub", password_env="KAFKA_PW",
                                 ca_file=str(tmp_path / "ca.pem"))
    assert sec.sasl_mechanism == "SCRAM-SHA-512" and sec.check_hostname
    assert SECRET not in repr(config) and SECRET not in str(config)
    assert SECRET.encode() not in pickle.dumps(config)
    assert pickle.loads(pickle.dumps(config)) == config
    settings = security.rdkafka_settings(sec)
    assert settings == {
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "pub", "sasl.password": SECRET,
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.endpoint.identification.algorithm": "https",
    }
    assert SECRET not in repr(settings)  # a logged settings dict shows '***'


def test_the_java_client_gets_the_same_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_PW", SECRET)
    config = load_config(write(tmp_path, GOOD))
    opts = security_options(config)
    assert opts == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f"{security.SCRAM_MODULE} required username=\"pub\" "
                                  'password="s3cr\\"et\\\\pw";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(tmp_path / "ca.pem"),
    }
    assert jvm_unsupported(config, "e") is None


def test_security_keys_of_kafka_client_no_longer_send_spark_to_the_python_read(
    tmp_path: Path,
) -> None:
    client = """\
    kafka:
      bootstrap: broker:9093
      client:
        security.protocol: SASL_SSL
        sasl.mechanisms: PLAIN
        sasl.username: u
        sasl.password: p
        ssl.ca.location: /etc/ca.pem
    """
    config = load_config(write(tmp_path, client))
    assert jvm_unsupported(config, "e") is None
    opts = security_options(config)
    assert opts["kafka.sasl.mechanism"] == "PLAIN"
    assert opts["kafka.sasl.jaas.config"].startswith(security.PLAIN_MODULE)
    assert opts["kafka.ssl.truststore.location"] == "/etc/ca.pem"
    other = client + "    linger.ms: 5\n"
    assert "linger.ms" in str(jvm_unsupported(load_config(write(tmp_path, other)), "e"))


@pytest.mark.parametrize(("block", "line", "key", "problem"), [
    ("protocol: SASL_SSL\n    password_env: X", 4, "kafka.security.username",
     "missing required key 'username'"),
    ("username: u\n    password_env: X\n    password_file: f", 6,
     "kafka.security.password_file", "exactly one of password_env, password_file"),
    ("username: u", 4, "kafka.security", "exactly one of"),
    ("protocol: SSL\n    username: u", 5, "kafka.security.username", "does not log in"),
    ("protocol: SASL_PLAINTEXT\n    username: u\n    password_env: X\n    ca_file: ca.pem", 7,
     "kafka.security.ca_file", "does not use TLS"),
    ("protocol: TLS", 4, "kafka.security.protocol", "'TLS' is not allowed"),
    ("username: u\n    password_env: X\n    ca_file: nope.pem", 6, "kafka.security.ca_file",
     "no such file"),
    ("username: u\n    pasword_env: X", 5, "kafka.security.pasword_env",
     "did you mean 'password_env'"),
])
def test_a_bad_block_names_file_line_and_key(
    tmp_path: Path, block: str, line: int, key: str, problem: str
) -> None:
    path = write(tmp_path, f"kafka:\n  bootstrap: b:1\n  security:\n    {block}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert (err.value.file, err.value.line, err.value.key) == (str(path), line, key)
    assert problem in err.value.problem


def test_security_and_kafka_client_security_keys_are_not_both_set(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "  client:\n    security.protocol: SSL\n")
    with pytest.raises(ConfigError, match=r"either kafka\.security or"):
        load_config(path)


def test_a_missing_password_names_where_it_was_looked_for_not_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_PW", raising=False)
    config: Config = load_config(write(tmp_path, GOOD))
    assert config.kafka.security is not None
    with pytest.raises(SubstreamsError, match=r"KAFKA_PW is not set .*user 'pub'"):
        security.rdkafka_settings(config.kafka.security)
    (tmp_path / "pw").write_text(SECRET + "\n")
    from_file = SecurityConfig(username="pub", password_file=str(tmp_path / "pw"))
    assert security.password(from_file) == SECRET
    assert repr(security.password(from_file)) == "'***'"
    gone = SecurityConfig(username="pub", password_file=str(tmp_path / "absent"))
    with pytest.raises(SubstreamsError, match=r"cannot read .*absent"):
        security.password(gone)
