"""A job for `substreams submit`'s own tests (run by spark-submit, no Kafka):

    hold PIDFILE   start a session, run a task (so Spark's Python workers exist), write
                   "driver_pid jvm_pid pgid" to PIDFILE, then wait forever
    fail           a task raises the error an operator's bad output raises
"""

from __future__ import annotations

import os
import sys
import time

from substreams.spark.lifecycle import die_with_parent, record_user_error
from substreams.spark.session import session
from substreams.spark.testing import OperatorOutputError

ERROR = "stream 'counts': epoch 0, result 0: field 'clicks' is missing (no default)"


def fail(_: int) -> int:
    raise OperatorOutputError(ERROR)


def main() -> None:
    die_with_parent()  # what run() and the job command line do first
    spark = session("submit-test", jvm_read=False)
    if sys.argv[1] == "hold":
        assert spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10
        tmp = sys.argv[2] + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{os.getpid()} {os.getppid()} {os.getpgid(0)}\n")
        os.replace(tmp, sys.argv[2])
        while True:
            time.sleep(1)
    try:
        spark.sparkContext.parallelize([1], 1).map(fail).collect()
    except Exception as exc:
        record_user_error(exc)  # what run() does with a query's error
        raise


if __name__ == "__main__":
    main()
