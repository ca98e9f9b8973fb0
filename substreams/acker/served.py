"""No drift between publishers and ackers: a publisher is refused at start when its
configuration names an acker substream that the acker serving it does not serve.

Why refuse rather than let the acker pick a new substream up while it runs: the acker's
substreams come from its configuration (a session's gap, a segment's terminal streams, the
control topic), which an acks message cannot carry; learning them from the first Register
would let a publisher's typo create a substream, and two configurations of one name could
disagree on its kind.  Why it matters: acks of a substream the acker does not serve are
dead-lettered (``unknown_substream``), and once the acker is restarted with the new
configuration it resumes past them from its checkpoint, so those windows are never
notified -- silently (docs/design.md, "Publishers and ackers agree on the substreams").

What the acker serves is read from its latest checkpoint (``AckerState.tables``, keyed by
substream; every transaction of the acker, heartbeats included, ends with one, and a
restarted acker's first step writes one with the tables its configuration added).  Which
acker: the shard owning the substream's acks partition, ``acker.shard_name``.  An acker
with no checkpoint has never run: there is nothing to drift from (the acks wait on the
topic for it).  A positive answer is kept for the process (an acker keeps its tables); a
refusal is asked again on the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from substreams.acker.protocol import segment_partition
from substreams.config import Config
from substreams.errors import SubstreamsError

log = logging.getLogger(__name__)

StateLookup = Callable[[Config, str | None, str], "tuple[Collection[str], int] | None"]
"""(config, bootstrap, acker name) -> (the substreams its latest checkpoint serves, when it
was written, ms), or None when it has none."""


class AckerDriftError(SubstreamsError):
    """A publisher's configuration names a substream its acker does not serve."""


_SERVED: set[tuple[str, str, str]] = set()
"""(bootstrap, acker name, substream) found served in this process."""
_LOCK = threading.Lock()


def acker_of(config: Config, substream: str) -> tuple[str, int]:
    """The name of the acker (shard) that serves ``substream``, and its shard index."""
    parts = config.acker.acks_partitions
    shards = config.acker.shards
    shard = segment_partition(substream, parts) % shards
    return config.acker.shard_name(shard, shards), shard


def drift_message(
    config: Config, stream: str, acker: str, shard: int, missing: Iterable[str],
    served: Collection[str], written_ms: int, now_ms: int,
) -> str:
    """What the refusal says: which acker, what it serves, what to do (pure)."""
    names = ", ".join(f"'{s}'" for s in missing)
    has = ", ".join(sorted(served)) or "none"
    age = max(0, now_ms - written_ms) / 1000.0
    run = f"substreams acker run -c {config.path}"
    if config.acker.shards > 1:
        run += f" --shard {shard}"
    return (
        f"stream '{stream}': substream {names} is not served by acker '{acker}' (its latest "
        f"checkpoint, written {age:.1f} s ago, serves: {has}); its acks would be "
        f"dead-lettered as unknown_substream and its windows never notified.  Restart the "
        f"acker with this configuration first (`{run}`), then start this publisher again; "
        f"or remove {names} from the publisher's configuration"
    )


def check_served(
    config: Config, bootstrap: str, stream: str, substreams: Iterable[str],
    lookup: StateLookup | None = None, now_ms: Callable[[], int] | None = None,
) -> None:
    """Raise :class:`AckerDriftError` if an acker with a checkpoint does not serve one of
    ``substreams`` (acker substreams of ``stream``) -- before the publisher registers."""
    look = lookup or _served_by_checkpoint
    by_acker: dict[tuple[str, int], list[str]] = {}
    for sub in substreams:
        with _LOCK:
            if (bootstrap, acker_of(config, sub)[0], sub) in _SERVED:
                continue
        by_acker.setdefault(acker_of(config, sub), []).append(sub)
    patience = max(1.0, 2 * config.acker.heartbeat_ms / 1000.0)
    for (acker, shard), subs in by_acker.items():
        deadline = time.monotonic() + patience
        missing: list[str] = []
        while True:
            found = look(config, bootstrap, acker)
            if found is None:
                log.info("stream '%s': acker '%s' has no checkpoint yet (never ran): "
                         "substreams %s not checked", stream, acker, ", ".join(subs))
                break
            served, written_ms = found
            missing = [s for s in subs if s not in served]
            with _LOCK:
                _SERVED.update((bootstrap, acker, s) for s in subs if s in served)
            # An acker restarted with the new configuration a moment ago writes its first
            # checkpoint with its first step: asked again for a little while before refusing.
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if found is not None and missing:
            now = now_ms() if now_ms is not None else int(time.time() * 1000)
            raise AckerDriftError(drift_message(
                config, stream, acker, shard, missing, served, written_ms, now
            ))


def _served_by_checkpoint(
    config: Config, bootstrap: str | None, name: str
) -> tuple[Mapping[str, object], int] | None:
    from substreams.acker.service import latest_state  # the service, only when asked

    found = latest_state(config, bootstrap, name)
    if found is None:
        return None
    state, written_ms = found
    return state.tables, written_ms


__all__ = ["AckerDriftError", "acker_of", "check_served", "drift_message"]
