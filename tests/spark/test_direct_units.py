"""The direct units of ``run()`` (an operator without ``group_by``: the source's read tasks
are the write units, no shuffle): the split is logged with the source offset, and a unit's
marker records which notifications it committed, so a replay cut differently fails loudly
instead of writing an epoch twice."""

from __future__ import annotations

import pytest

from substreams.errors import SubstreamsError
from substreams.kafka import client
from substreams.kafka.topics import ensure_topics
from substreams.spark.executor import DIRECT_UNITS, UnitPlan, commit_topic, run_unit
from substreams.spark.offsets import SourceOffset
from substreams.spark.operator import EpochInfo, Row, info_rows
from tests.conftest import ConfigFactory
from tests.spark.jobs import load_job, out_stream

pytestmark = pytest.mark.spark


def test_source_offset_carries_the_task_split() -> None:
    end = SourceOffset(7, tasks=3)
    assert end.to_json() == {"control": 7, "tasks": 3}
    assert SourceOffset.from_json(end.to_json()) == end
    # an offset logged before the split was recorded: the query's option decides
    assert SourceOffset.from_json({"control": 7}).tasks is None


def _rows(*windows: tuple[int, int]) -> list[Row]:
    out: list[Row] = []
    for window, offset in windows:
        info = EpochInfo(window, offset, 1, 2, [{"user": "a"}, {"user": "b"}])
        out += info_rows(info)
    return out


def test_a_replayed_unit_holding_other_notifications_fails_loudly(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}, out_stream("counts", "window_count.avsc")],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    counts = config.streams[1].name
    bootstrap = config.kafka.bootstrap
    ensure_topics(client.admin(bootstrap, config), [(commit_topic(counts), 1)], 1)
    op = load_job("windowed_counts").WindowedCounts(1000)
    plan = UnitPlan(op, 0, DIRECT_UNITS, config, counts, "spark.direct", bootstrap)

    first = run_unit(plan, 0, _rows((0, 3), (1, 5)))
    assert [(s.epoch_label, s.results, s.written) for s in first] == [
        ("0", 2, True), ("1", 2, True)
    ]
    # the same unit of the same batch holding the same notifications: committed, skipped
    again = run_unit(plan, 0, _rows((0, 3), (1, 5)))
    assert [(s.epoch_label, s.written) for s in again] == [("0", False), ("1", False)]
    # cut differently (the batch's split changed): refused, nothing written
    with pytest.raises(SubstreamsError, match="cut differently"):
        run_unit(plan, 0, _rows((0, 3)))
