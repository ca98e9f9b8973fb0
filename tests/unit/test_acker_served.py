"""The publisher/acker drift check's rule (:mod:`substreams.acker.served`) with a fake
checkpoint lookup: which acker (shard) is asked, what is refused, what the refusal says."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pytest

from substreams.acker.served import AckerDriftError, acker_of, check_served
from substreams.config import Config
from substreams.config.loader import load_config_text

SCHEMA = Path(__file__).resolve().parents[1] / "sim" / "record.avsc"


def config(shards: int) -> Config:
    text = (
        "streams:\n"
        f"  - {{name: orders, schema: {SCHEMA.name}, order_key: k, partitions: 1}}\n"
        "substreams:\n"
        + "".join(f"  - {{name: s{i}, stream: orders, kind: epoch, field: e}}\n"
                  for i in range(6))
        + f"acker: {{name: ack, acks_partitions: 4, shards: {shards}, heartbeat_ms: 10}}\n"
    )
    return load_config_text(text, SCHEMA.with_name("served.yaml"))


class Checkpoints:
    def __init__(self, served: dict[str, Collection[str]]) -> None:
        self.served = served
        self.asked: list[str] = []

    def __call__(self, _: Config, __: str | None, name: str) -> tuple[Collection[str], int] | None:
        self.asked.append(name)
        got = self.served.get(name)
        return None if got is None else (got, 1_000)


def test_each_substream_is_checked_against_the_shard_that_serves_it() -> None:
    cfg = config(2)
    names = [s.name for s in cfg.substreams]
    by_shard: dict[str, list[str]] = {}
    for name in names:
        acker, shard = acker_of(cfg, name)
        assert acker == f"ack.shard{shard}of2"
        by_shard.setdefault(acker, []).append(name)
    assert len(by_shard) == 2  # the six names land on both shards
    lookup = Checkpoints(by_shard)
    check_served(cfg, "b1", "orders", names, lookup)
    assert sorted(lookup.asked) == sorted(by_shard)
    check_served(cfg, "b1", "orders", names, lookup)  # served is kept for the process
    assert len(lookup.asked) == 2


def test_an_unserved_substream_is_refused_naming_the_shard_and_the_command() -> None:
    cfg = config(2)
    acker, shard = acker_of(cfg, "s5")
    lookup = Checkpoints({acker: ["s0"], f"ack.shard{1 - shard}of2": ["s1"]})
    with pytest.raises(AckerDriftError) as refused:
        check_served(cfg, "b2", "orders", ["s5"], lookup, now_ms=lambda: 3_500)
    assert str(refused.value) == (
        f"stream 'orders': substream 's5' is not served by acker '{acker}' (its latest "
        "checkpoint, written 2.5 s ago, serves: s0); its acks would be dead-lettered as "
        "unknown_substream and its windows never notified.  Restart the acker with this "
        f"configuration first (`substreams acker run -c {cfg.path} --shard {shard}`), then "
        "start this publisher again; or remove 's5' from the publisher's configuration"
    )
    assert len(lookup.asked) > 1  # asked again for a while (a restart's first checkpoint)


def test_an_acker_that_never_ran_has_nothing_to_drift_from() -> None:
    cfg = config(1)
    check_served(cfg, "b3", "orders", ["s0", "s1"], Checkpoints({}))
