"""Payloads that do not fit a schema are named by field and value: in the publisher's
error and in ``run_operator``'s check of an operator's output (no broker, no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.spark.operator import EpochOperator, Row
from substreams.spark.testing import OperatorOutputError, run_operator
from substreams.streams.validate import payload_mismatch
from tests.unit.test_publisher_memory import World
from tests.unit.test_publisher_memory import config as config

COUNT = {
    "type": "record", "name": "Count", "namespace": "t",
    "fields": [{"name": "user", "type": "string"}, {"name": "clicks", "type": "long"},
               {"name": "note", "type": ["null", "string"], "default": None}],
}


def test_a_mismatch_names_each_field_and_its_value() -> None:
    assert payload_mismatch(COUNT, {"user": "a", "clicks": 1}) is None
    assert payload_mismatch(COUNT, {"user": "a"}) == "field 'clicks' is missing (no default)"
    assert payload_mismatch(COUNT, {"user": "a", "clicks": "7"}) == (
        "field 'clicks': value '7' (str) is not long")
    assert payload_mismatch(COUNT, {"user": "a", "clicks": 1, "note": 3}) == (
        "field 'note': value 3 (int) is not null or string")


@pytest.fixture
def out_config(tmp_path: Path) -> Path:
    (tmp_path / "count.avsc").write_text(json.dumps(COUNT))
    (tmp_path / "c.yaml").write_text(
        "kafka: {bootstrap: '127.0.0.1:1'}\n"
        "streams:\n  - {name: counts, schema: count.avsc, order_key: clicks}\n"
    )
    return tmp_path / "c.yaml"


class Counts(EpochOperator):
    def __init__(self, field: str = "clicks") -> None:
        self.field = field

    def on_epoch(self, epoch: object, rows: list[Row]) -> list[Row]:
        return [{"user": "ada", self.field: len(rows)}]


def test_run_operator_checks_results_against_the_output_schema(out_config: Path) -> None:
    epochs = {0: [{"user": "ada"}], 1: []}
    good = run_operator(Counts(), epochs, config=out_config, output_stream="counts")
    assert good.results[0] == [{"user": "ada", "clicks": 1}]
    with pytest.raises(OperatorOutputError) as missing:
        run_operator(Counts("count"), epochs, config=out_config, output_stream="counts")
    assert str(missing.value) == (
        "stream 'counts': epoch 0, result 0: field 'clicks' is missing (no default)")
    with pytest.raises(OperatorOutputError, match=r"field 'clicks': value 'x' \(str\)"):
        run_operator(lambda e, rows: [{"user": "a", "clicks": "x"}], epochs,
                     config=out_config, output_stream="counts")
    with pytest.raises(SubstreamsError, match="needs the config"):
        run_operator(Counts(), epochs, output_stream="counts")
    # without an output stream nothing is checked (as before)
    assert run_operator(Counts("count"), epochs).results[0] == [{"user": "ada", "count": 1}]


def test_the_publisher_names_the_field_and_value_it_cannot_encode(config: Config) -> None:
    world = World(config)
    with world.publisher() as pub:
        with pytest.raises(SubstreamsError) as one:
            pub.publish({"user": "a", "url": 5, "ts": 1})
        assert "field 'url': value 5 (int) is not string" in str(one.value)
        with pytest.raises(SubstreamsError) as many:
            pub.publish_many([{"user": "a", "url": "/", "ts": 2}, {"user": "b", "ts": 3}])
        assert "record 1 of the batch" in str(many.value)
        assert "field 'url' is missing (no default)" in str(many.value)
