"""Publisher-only workload to run under py-spy (issue #16: where the time goes).

    py-spy record --format raw -r 250 -o OUT.txt -- \
        python -m substreams_bench.profile_publish --api publish|many --granularity 1 \
            [--records 40000]

Starts an embedded Apache Kafka, opens one acker-tracked publisher (``--untracked``: none)
on a 4-partition stream, writes ``--records`` records sealing every ``--granularity`` (the
throughput benchmark's tracked line, without the acker process and the readers, so that the
samples are the publisher's own), and prints the publish rate and the CPU time of the
publishing thread per record (``time.thread_time``: librdkafka's own threads and the broker
excluded, and much steadier than the rate on a shared machine) with the load average at the
end (on the shared machine, what else was running).  ``--api many`` hands the
records to ``publish_many`` in slices of ``--slice`` records.
"""

from __future__ import annotations

import argparse
import os
import time

from substreams.app import UNTRACKED
from substreams_bench.harness import bench_context
from substreams_bench.throughput import BATCH, PARTITIONS, _config, _publish, sliced_publish_many
from substreams_bench.workload import close_all, open_publishers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", choices=("publish", "many"), default="publish")
    ap.add_argument("--granularity", type=int, default=1)
    ap.add_argument("--records", type=int, default=40000)
    ap.add_argument("--untracked", action="store_true")
    args = ap.parse_args()
    with bench_context(quick=True) as ctx:
        config = _config(ctx, None if args.untracked else "acker")
        stream = config.streams[0].name
        assert config.streams[0].partitions == PARTITIONS
        kwargs = {"mechanisms": UNTRACKED} if args.untracked else {}
        (pub,) = open_publishers(
            config, stream, ["src0"], ctx.bootstrap, batch_size=BATCH, **kwargs
        )
        substream = None if args.untracked else config.substreams[0].name
        t0 = time.perf_counter()
        c0 = time.thread_time()
        if args.api == "many":
            sliced_publish_many(pub, substream, args.records, args.granularity)
        else:
            _publish(pub, substream, args.records, args.granularity)
        pub.flush()
        dt = time.perf_counter() - t0
        cpu = time.thread_time() - c0
        close_all([pub])
        print(
            f"{args.api} g={args.granularity} {'untracked' if args.untracked else 'acker'}: "
            f"{args.records} records in {dt:.2f} s = {args.records / dt:,.0f} records/s "
            f"({dt / args.records * 1e6:.1f} us/record); publishing thread CPU "
            f"{cpu / args.records * 1e6:.1f} us/record; load average "
            + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        )


if __name__ == "__main__":
    main()
