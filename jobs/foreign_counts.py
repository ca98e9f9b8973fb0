"""Clicks per user in each one-second window of `legacy.clicks` (a JSON topic written by a
plain producer), each window once, exactly when it is complete: notifications() over the
ingested stream, no Spark needed.

    python jobs/foreign_counts.py -c jobs/substreams.foreign.yaml [--substream clicks_json_1s]
"""

from __future__ import annotations

import argparse
from collections import Counter

from substreams.app import Application
from substreams.config import load_config
from substreams.streams.records import Entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--substream", default="clicks_json_1s")
    args = parser.parse_args()
    config = load_config(args.config)
    size = config.substream(args.substream).size_ms or 1
    with Application(config).notifications(args.substream, records=True) as notes:
        for note in notes:
            users = Counter(str(e.payload["user"]) for e in note.entries
                            if isinstance(e, Entry))
            top = ", ".join(f"{u}={n}" for u, n in users.most_common(3))
            print(f"window {note.time} (starts {int(note.time) * size} ms): "
                  f"{note.records} clicks, {len(users)} users; top {top}", flush=True)


if __name__ == "__main__":
    main()
