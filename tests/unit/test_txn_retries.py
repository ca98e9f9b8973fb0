"""The CONCURRENT_TRANSACTIONS counter, on librdkafka 2.16 ``debug=eos`` lines recorded from a
producer committing a seal right after its records' transaction (embedded Kafka 4.1)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from substreams.kafka import client

REFUSED = (
    'TxnCoordinator/1: AddPartitionsToTxn response: partition "{p}": [{n}]: Broker: Producer '
    "attempted to update a transaction while another concurrent operation on the same "
    "transaction was ongoing"
)
RECORDED = [  # (facility, line) as confluent-kafka passes them to logger.log
    ("TXNCOMMIT", "Flushing 19 outstanding message(s) prior to commit"),
    ("ADDPARTS", "TxnCoordinator/1: Registering partitions with transaction"),
    ("ADDPARTS", REFUSED.format(p="u", n=0)),
    ("ADDPARTS", "TxnCoordinator/1: Registering partitions with transaction"),
    ("ADDPARTS", REFUSED.format(p="u", n=0)),
    ("ADDPARTS", "TxnCoordinator/1: Registering partitions with transaction"),
    ("ADDPARTS", "u [0] registered with transaction"),
    ("TXNSTATE", "Transaction state change BeginCommit -> CommittingTransaction"),
    ("ENDTXN", "EndTxn returned NO_ERROR in state CommittingTransaction (may_retry=true)"),
    ("ADDPARTS", "TxnCoordinator/1: Registering partitions with transaction"),
    # one refused request of two partitions: a line each, one retry
    ("ADDPARTS", REFUSED.format(p="t", n=0)),
    ("ADDPARTS", REFUSED.format(p="t", n=1)),
    ("ADDPARTS", "TxnCoordinator/1: Registering partitions with transaction"),
    ("ADDPARTS", "t [0] registered with transaction"),
]


def replay(counter: client.TxnRetryCounter) -> None:
    for facility, line in RECORDED:
        counter.log(logging.DEBUG, "%s [%s] %s", facility, "rdkafka#producer-10",
                    f"[thrd:main]: {line}")


def test_counts_each_refused_request_once(tmp_path: Path) -> None:
    counter = client.TxnRetryCounter("pub-a", tmp_path)
    replay(counter)
    assert counter.retries == 3
    assert client.txn_retries(tmp_path) == {"pub-a": 3}


def feed(counter: client.TxnRetryCounter, lines: list[str]) -> None:
    for line in lines:
        counter.log(logging.DEBUG, "%s [%s] %s", "ADDPARTS", "rdkafka#producer-10",
                    f"[thrd:main]: {line}")


REGISTERING = "TxnCoordinator/1: Registering partitions with transaction"


def test_only_the_refusals_a_commit_waited_for_are_commit_waits(tmp_path: Path) -> None:
    counter = client.TxnRetryCounter("pub-a", tmp_path)
    # the next records' transaction, refused right behind a commit, registered before its own
    feed(counter, [REGISTERING, REFUSED.format(p="t", n=0), REGISTERING,
                   "t [0] registered with transaction"])
    counter.commit_begins()
    counter.commit_ends()
    # a lone seal's transaction: refused before its commit began, retried during it
    feed(counter, [REGISTERING, REFUSED.format(p="a", n=0)])
    counter.commit_begins()
    feed(counter, [REGISTERING, REFUSED.format(p="a", n=0), REGISTERING,
                   "a [0] registered with transaction"])
    counter.commit_ends()
    assert (counter.retries, counter.commit_waits) == (3, 2)
    assert client.txn_retries(tmp_path) == {"pub-a": 3}
    assert client.txn_retries(tmp_path, commit_waits=True) == {"pub-a": 2}


def test_counts_sum_over_producers_and_start_at_zero(tmp_path: Path) -> None:
    quiet = client.TxnRetryCounter("quiet", tmp_path)
    replay(client.TxnRetryCounter("pub-a", tmp_path))
    replay(client.TxnRetryCounter("pub-a", tmp_path))  # the same id, reopened
    assert quiet.retries == 0
    assert client.txn_retries(tmp_path) == {"quiet": 0, "pub-a": 6}


def test_errors_still_reach_the_library_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counter = client.TxnRetryCounter("pub-a", tmp_path)
    with caplog.at_level(logging.DEBUG, client.RDKAFKA_LOG.name):
        counter.log(logging.DEBUG, "%s [%s] %s", "TXNSTATE", "p", "debug line")
        counter.log(logging.ERROR, "%s [%s] %s", "FAIL", "p", "Connect failed")
    assert [r.getMessage() for r in caplog.records] == ["FAIL [p] Connect failed"]


def test_opt_in_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(client.ENV_COUNT_TXN_RETRIES, raising=False)
    with client.counting_txn_retries() as folder:
        assert client.ENV_COUNT_TXN_RETRIES in os.environ
        assert client.txn_retries(folder) == {}
    assert client.ENV_COUNT_TXN_RETRIES not in os.environ


def test_a_value_that_is_not_a_folder_warns_and_counts_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(client.ENV_COUNT_TXN_RETRIES, "1")
    with caplog.at_level(logging.WARNING, client.log.name):
        producer = client.producer("127.0.0.1:1", transactional_id="not-a-folder")
    assert producer is not None
    assert [r.getMessage() for r in caplog.records] == [
        f"{client.ENV_COUNT_TXN_RETRIES}='1' is not an existing folder: "
        "CONCURRENT_TRANSACTIONS retries are not counted (the benches set it themselves)"
    ]
    assert list(tmp_path.iterdir()) == []
