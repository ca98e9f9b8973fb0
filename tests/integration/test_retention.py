"""Everything that reads "from the beginning" works once retention moved a log's start past 0.

The log starts are moved with ``AdminClient.delete_records`` -- the same thing retention does
to a partition (its log start offset advances; reads below it are reset to it), but at a
moment of the test's choosing instead of after ``log.retention.check.interval.ms``."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from substreams.acker.client import AckerClient
from substreams.acker.service import checkpoint_topic
from substreams.app import Application
from substreams.control.io import read_control
from substreams.control.subscriber import Data, Subscriber
from substreams.control.verify import verify_config
from substreams.kafka import client
from tests.conftest import ConfigFactory, follow_notifications
from tests.integration.test_acker import FAST, notifications, wait_notifications
from tests.integration.test_acker_commands import running_acker as acker


def delete_head(bootstrap: str, topic: str, keep: int) -> int:
    """Delete all but the last ``keep`` offsets of partition 0 of ``topic``; the new start."""
    admin = client.admin(bootstrap)
    consumer = client.consumer(bootstrap)
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    start = max(0, int(high) - keep)
    [fut] = admin.delete_records([TopicPartition(topic, 0, start)]).values()
    fut.result(30)
    return start


def test_readers_from_the_beginning_work_after_the_head_was_deleted(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    bootstrap = config.kafka.bootstrap
    control = config.acker.control_topic(sub)
    with Application(config).publisher(stream, "src") as pub:
        with acker(config):
            with AckerClient(config) as ctl:  # a command session: the command topic has a head
                ctl.connect(timeout=20)
                ctl.status(timeout=20)
            for t in range(6):
                pub.publish({"user": "u", "url": f"/{t}", "ts": t})
                pub.seal(sub, t)
                # one control record per time (times that terminate together would share one,
                # and there might be no head left to delete under the last three)
                wait_notifications(config, sub, t + 1)
        # the acker is stopped; retention takes the heads of what it reads back on start
        heads = {
            control: delete_head(bootstrap, control, keep=3),
            checkpoint_topic(config): delete_head(bootstrap, checkpoint_topic(config), keep=4),
            config.acker.command_topic: delete_head(bootstrap, config.acker.command_topic, 1),
        }
        assert all(start > 0 for start in heads.values()), heads
        kept = [n.time for n in notifications(config, sub)]
        assert kept and kept[0] > 0 and kept == sorted(kept)
        with acker(config):  # recovery: chains continued, latest checkpoint, command replay
            for t in range(6, 9):
                pub.publish({"user": "u", "url": f"/{t}", "ts": t})
                pub.seal(sub, t)
            follow_notifications(config, sub, len(kept) + 3, 30)  # times 6, 7 and 8
            with AckerClient(config) as ctl:
                ctl.connect(timeout=20)
                status = ctl.status(timeout=20)
            assert sub in {s.substream for s in status.substreams}
    times = [n.time for n in notifications(config, sub)]
    assert times == list(range(times[0], 9)), times  # in order, once each, none lost
    assert len(read_control(bootstrap, control)) > 0
    # verify proves each chain from the first remaining record, and says so
    [report] = verify_config(config)
    assert report.ok and report.start_offset == heads[control], report
    # a subscriber from the beginning gets every remaining epoch whole
    with Subscriber(config, [sub], start="beginning", mode="firm", idle_timeout=2.0) as s:
        seen = [e.time for e in s if isinstance(e, Data)]
    assert seen == times, seen
