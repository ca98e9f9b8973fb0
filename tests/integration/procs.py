"""Publisher processes for the crash and hand-over tests (run with ``python -m``).

``epochs CONFIG STREAM SUBSTREAM SOURCE PARTITION EPOCHS SEED``: publish 1-3 records per epoch
into PARTITION and seal each epoch, committing at random points; a restart (same source id:
a new incarnation) first finds the highest epoch its source committed a record in, seals it,
and goes on after it -- what a real producer that recovers its position from the stream does.
At least one record per epoch: a seal is committed with or after its epoch's records, so the
highest committed record bounds every committed seal (an epoch sealed with no record would be
invisible to this recovery, and its restart would write into a sealed epoch).
One partition per source: a ``read_committed`` reader stops at the first open transaction of
a partition, so another source's open transaction would hide this one's later commits.

``sessions CONFIG STREAM SOURCE PARTITION N SEED``: N records of users u0..u3 (keys shared
with the other sources) at strictly increasing event times drawn from SEED (the same plan in
every incarnation of a source: pass the same SEED), the watermark moved before each record,
committed at random points; a restart resumes after the highest ``ts`` its source committed.
Nothing else is recovered: a publisher keeps no session state (the acker cuts sessions).

``stage CONFIG NAME``: run the configured stage NAME (each input becomes two outputs, url
suffixed ``#a`` and ``#b``) until killed.

``serve CONFIG STREAM SOURCE``: a publisher driven by JSON lines on stdin
(``["publish", url, ts]``, ``["flush"]``, ``["seal", substream, t]``, ``["close"]``,
``["seal_and_die_in_commit", [substream, ...], t]``), one answer line per command: ``ok`` or
``error <ExceptionClass>: <message>`` (none for the last: it dies in its commit).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from typing import Any

from substreams.app import Application
from substreams.config import load_config
from substreams.kafka import client
from substreams.streams.listener import Listener
from substreams.streams.records import Entry


def committed_max(config_path: str, stream: str, source: str, partition: int) -> int:
    """The highest ``ts`` of a committed record of ``source`` (-1 if none)."""
    config = load_config(config_path)
    best = -1
    with Listener(config, stream, partitions=[partition]) as listener:
        for e in listener.entries(idle_timeout=0.3):
            if isinstance(e, Entry) and e.source == source:
                best = max(best, int(e.payload["ts"]))
    return best


def epochs(
    path: str, stream: str, substream: str, source: str, partition: int, n: int, seed: int
) -> None:
    config = load_config(path)
    rng = random.Random(seed)
    with Application(config).publisher(stream, source, batch_size=rng.randint(1, 4)) as pub:
        # The Publisher's start fenced the previous incarnation (its open transaction is
        # aborted), so what the stream holds now is exactly what was committed.
        start = committed_max(path, stream, source, partition) + 1
        if start > 0:
            pub.seal(substream, start - 1)
        print(f"start {start}", flush=True)
        for e in range(start, n):
            for k in range(rng.randint(1, 3)):
                payload = {"user": source, "url": f"/{e}/{seed}/{k}", "ts": e}
                pub.publish(payload, partition=partition)
                if rng.random() < 0.3:
                    pub.flush()
                    print("committed", flush=True)
            commit = rng.random() < 0.7
            pub.seal(substream, e, commit=commit)
            print("committed" if commit else f"sealed {e}", flush=True)
            time.sleep(rng.uniform(0, 0.03))
    print("done", flush=True)


def session_plan(n: int, seed: int) -> list[tuple[int, str]]:
    """(ts, user) for one source: gaps mostly inside a 50 ms session gap, sometimes wider."""
    rng = random.Random(seed)
    ts, out = 0, []
    for _ in range(n):
        ts += rng.choice((1, 5, 20, 40, 120, 300))
        out.append((ts, f"u{rng.randrange(4)}"))
    return out


def sessions(path: str, stream: str, source: str, partition: int, n: int, seed: int) -> None:
    config = load_config(path)
    rng = random.Random()
    with Application(config).publisher(stream, source, batch_size=rng.randint(1, 4)) as pub:
        done = committed_max(path, stream, source, partition)
        print(f"start after {done}", flush=True)
        for ts, user in session_plan(n, seed):
            if ts <= done:
                continue
            pub.watermark(ts)
            pub.publish({"user": user, "url": f"/{source}/{ts}", "ts": ts}, partition=partition)
            if rng.random() < 0.3:
                pub.flush()
                print("committed", flush=True)
            time.sleep(rng.uniform(0, 0.01))
        pub.watermark(10**9, commit=True)
    print("done", flush=True)


def stage(path: str, name: str) -> None:
    import threading
    from collections.abc import Iterable, Mapping

    from substreams.acker.stage import Stage

    def twice(entry: Entry) -> Iterable[Mapping[str, Any]]:
        p = entry.payload
        return [{**p, "url": f"{p['url']}#a"}, {**p, "url": f"{p['url']}#b"}]

    with Stage(load_config(path), name, twice, max_batch=7) as st:
        print("running", flush=True)
        st.run(threading.Event())


def die_in_commit() -> None:
    """From now on a commit delivers the transaction's messages (the records, the acker's
    reports and seals) and then SIGKILLs this process: it dies inside an open transaction,
    which holds the last stable offset of every partition it wrote until it is aborted."""

    def commit(
        producer: Any, what: str, patience: float = 0.0, call_timeout: float = 0.0
    ) -> None:
        producer.flush(30)
        os.kill(os.getpid(), signal.SIGKILL)

    client.commit_transaction = commit  # type: ignore[assignment]


def serve(path: str, stream: str, source: str) -> None:
    config = load_config(path)
    pub = Application(config).publisher(stream, source)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd[0] == "publish":
                pub.publish({"user": source, "url": cmd[1], "ts": int(cmd[2])})
            elif cmd[0] == "flush":
                pub.flush()
            elif cmd[0] == "seal":
                pub.seal(cmd[1], int(cmd[2]))
            elif cmd[0] == "close":
                pub.close()
            elif cmd[0] == "seal_and_die_in_commit":
                die_in_commit()
                for sub in cmd[1]:
                    pub.seal(sub, int(cmd[2]), commit=False)
                pub.flush()  # writes the reports, "commits": never returns
            print("ok", flush=True)
        except Exception as exc:
            print(f"error {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "epochs":
        a = sys.argv[2:]
        epochs(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]), int(a[6]))
    elif sys.argv[1] == "sessions":
        a = sys.argv[2:]
        sessions(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
    elif sys.argv[1] == "stage":
        stage(sys.argv[2], sys.argv[3])
    else:
        serve(*sys.argv[2:5])
