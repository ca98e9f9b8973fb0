"""Observers: threads that note the wall-clock moment a substream's end becomes visible.

Why our own poll loop and not ``ControlTail.poll``/``PunctuatedReader.poll``: those use
``consume(n, timeout)``, which waits out the whole timeout when fewer than n messages
arrive; a latency probe must wake on the first message (``poll``), then drain.
Both observers use the mechanisms' own decoding and logic (``decode_control``, the
punctuation ``Aligner``), so what they see is what a subscriber sees.
"""

from __future__ import annotations

import threading
import time
from typing import Self

from confluent_kafka import Message, TopicPartition

from substreams.config import Config
from substreams.kafka.read import Reader
from substreams_bench.harness import BenchError


class Observer:
    """Base: a thread that records ``seen[time] = time.time()`` and wakes waiters."""

    def __init__(
        self, bootstrap: str, config: Config | None, assignment: list[TopicPartition]
    ) -> None:
        self.seen: dict[object, float] = {}
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._reader = Reader(bootstrap, config, assignment, name="bench observer")
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-observer")

    def start(self, timeout: float = 30.0) -> Self:
        """Start, and return once every partition was fetched to its end once: a fresh
        consumer's first fetch (metadata, connections) must not count as latency."""
        self._thread.start()
        if not self.ready.wait(timeout):
            raise BenchError(f"bench observer: no partition end within {timeout} s")
        return self

    def _handle(self, msg: Message) -> list[object]:
        raise NotImplementedError

    def _run(self) -> None:
        reader = self._reader
        try:
            while not self._stop.is_set():
                done: list[object] = []
                for msg in reader.poll_batch(0.1, 1000):
                    done.extend(self._handle(msg))
                if not self.ready.is_set() and reader.caught_up:
                    self.ready.set()
                if done:
                    now = time.time()
                    with self._cond:
                        for t in done:
                            self.seen.setdefault(t, now)
                        self._cond.notify_all()
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._cond.notify_all()

    def wait_for(self, t: object, timeout: float) -> float:
        """The moment ``t`` was seen (waits up to ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while t not in self.seen:
                if self.errors:
                    raise BenchError(f"bench observer: {self.errors[0]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"bench observer: time {t!r} not seen within {timeout} s")
                self._cond.wait(left)
            return self.seen[t]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._reader.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class AckerObserver(Observer):
    """Sees ``EpochComplete`` records on a substream's control topic."""

    def __init__(self, bootstrap: str, config: Config, substream: str) -> None:
        topic = config.acker.control_topic(substream)
        super().__init__(bootstrap, config, [TopicPartition(topic, 0, 0)])

    def _handle(self, msg: Message) -> list[object]:
        from substreams.control.io import decode_control
        from substreams.control.messages import completions

        return [note.time for note in completions(decode_control(msg).body)]


class PunctuationObserver(Observer):
    """One consumer of every data partition, aligning punctuations like a subscriber of the
    whole substream (``PunctuatedReader``'s logic, with a waking poll loop)."""

    def __init__(self, bootstrap: str, config: Config, substream: str) -> None:
        from substreams.punctuation.aligner import Aligner
        from substreams.streams.listener import StreamDecoder

        sub = config.substream(substream)
        parts = config.stream(sub.stream).partitions
        self.substream = substream
        self.decoder = StreamDecoder(config, sub.stream)
        self.aligner = Aligner(substream, sub.stream, range(parts), bound=sub.bound)
        self.punctuations = 0
        super().__init__(
            bootstrap, config, [TopicPartition(sub.stream, q, 0) for q in range(parts)]
        )

    def _handle(self, msg: Message) -> list[object]:
        from substreams.punctuation.aligner import Punctuation, Terminated
        from substreams.streams.listener import PunctuationEntry

        entry = self.decoder.decode(msg)
        if isinstance(entry, PunctuationEntry):
            self.punctuations += 1
            p = Punctuation.from_wire(entry.fields, entry.partition, entry.index)
            events = self.aligner.on_punctuation(p)
        else:
            events = self.aligner.on_record(entry)
        return [ev.time for ev in events if isinstance(ev, Terminated)]


class RecordCounter(Observer):
    """Counts the messages of a topic (what a reader that does no work of its own sees)."""

    def __init__(self, bootstrap: str, config: Config | None, topic: str, partitions: int) -> None:
        self.count = 0
        super().__init__(
            bootstrap, config, [TopicPartition(topic, q, 0) for q in range(partitions)]
        )

    def _handle(self, msg: Message) -> list[object]:
        self.count += 1
        return [self.count]
