"""User-facing errors.

Everything a user can cause by a mistake (a bad config, a wrong schema, a second
publisher...) raises a :class:`SubstreamsError`. The CLI prints ``error: <message>``
for these and exits 2 *without* a traceback, so the message alone must say what is
wrong and where; anything else escaping the CLI is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any


class SubstreamsError(Exception):
    """Base of every user-facing error: the message is the whole diagnosis."""


class ConfigError(SubstreamsError):
    """An invalid ``substreams.yaml`` (or a lookup of a name the config does not define).

    The fields are kept separately (not only in the message) so that tests and tools
    can check *where* the problem is without parsing text. The message reads
    ``{file}:{line}: {key}: {problem}``; ``line`` is omitted when unknown (missing
    file, lookups) and ``key`` when the problem is not about one key (YAML syntax).
    """

    file: str
    line: int | None
    key: str
    value: object
    allowed: str | None
    problem: str
    column: int | None

    def __init__(
        self,
        file: str,
        line: int | None,
        key: str,
        problem: str,
        *,
        value: object = None,
        allowed: str | None = None,
        column: int | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.key = key
        self.problem = problem
        self.value = value
        self.allowed = allowed
        self.column = column
        location = file
        if line is not None:
            location += f":{line}"
            if column is not None:
                location += f":{column}"
        parts = [location, key, problem] if key else [location, problem]
        super().__init__(": ".join(parts))

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments defeat the default Exception pickling; errors may
        # cross process boundaries (Spark executors, multiprocessing) intact.
        return (
            _rebuild_config_error,
            (self.file, self.line, self.key, self.problem, self.value, self.allowed, self.column),
        )


def _rebuild_config_error(
    file: str,
    line: int | None,
    key: str,
    problem: str,
    value: object,
    allowed: str | None,
    column: int | None,
) -> ConfigError:
    return ConfigError(file, line, key, problem, value=value, allowed=allowed, column=column)


class DecodeError(SubstreamsError):
    """Bytes read from a topic are not a message of that topic's protocol.

    The one error every decoder raises for any input it cannot read (truncated, garbled,
    foreign, written with another schema): data envelopes raise the subclass
    :class:`SchemaMismatchError`, acks / control / command / response / punctuation messages
    and acker checkpoints raise :class:`ProtocolError`.  A service catches ``DecodeError``
    and dead-letters the message with ``str(exc)`` as the reason; any other exception out of
    a decoder is a bug (the property tests in ``tests/unit/test_decoder_fuzz.py`` hold every
    decoder to this).
    """


class SchemaMismatchError(DecodeError):
    """A record or topic does not match the Avro schema the config declares for its stream.

    Raised instead of silently mis-decoding: a writer and a reader that disagree on
    the schema would otherwise produce garbage epochs and frontiers.
    """


class ForeignRecordError(SchemaMismatchError):
    """Bytes on a data topic that are not a single-object encoded Avro record at all (no
    ``C3 01`` marker and fingerprint: JSON from a plain producer, an empty value)."""


class UnknownSchemaError(SchemaMismatchError):
    """A single-object encoded record whose writer-schema fingerprint no registered schema
    of the stream has."""


class BadRecordError(SchemaMismatchError):
    """A reader met a record it cannot decode on a stream whose ``on_bad_record`` is
    ``fail``: the message names the topic, partition, offset and the reason."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str, detail: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason
        self.detail = detail
        super().__init__(
            f"undecodable record at {topic}[{partition}]@{offset} ({reason}): {detail} "
            f"(stream '{topic}' has on_bad_record: fail; with dead_letter, the default, "
            "readers dead-letter it and go on)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # crosses from Spark's Python workers to the driver intact
        return (BadRecordError, (self.topic, self.partition, self.offset, self.reason,
                                 self.detail))


class OrderKeyRegressionError(SubstreamsError):
    """A publisher tried to write a record whose order key is below one already written.

    Firm bounds rely on the order key being non-decreasing per partition; a
    regression would make an already-closed substream receive more records.
    """


class SealedTimeError(SubstreamsError):
    """A record at a time its source already sealed: it would arrive after its
    substream's end (refused before anything is written)."""


class PublisherFencedError(SubstreamsError):
    """This publisher was fenced: another instance took over its transactional id.

    The fenced instance must stop; continuing would interleave two writers and break
    the exactly-once guarantees the acker's frontiers depend on.
    """


class PublisherAlreadyAcquiredError(SubstreamsError):
    """A publisher for this stream/partition is already held in this process.

    One writer per partition keeps order keys monotonic; acquire it once and share it.
    """


class BrokerError(SubstreamsError):
    """The Kafka broker is unreachable or rejected an operation (topic creation, auth...).

    Wraps client-library errors so the CLI can report them without a traceback.
    """


class ProtocolError(DecodeError):
    """A control, ack, command, response or punctuation message, or a checkpoint, could not
    be understood.

    Signals a version mismatch or a foreign producer on an internal topic; such
    messages are never guessed at, since a wrong guess corrupts substream tracking.
    """
