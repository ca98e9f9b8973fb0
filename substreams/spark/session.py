"""A SparkSession with the ``substreams`` source registered.

Why a helper: the same job must run under ``spark-submit`` (master and settings come from the
command line) and from plain Python or tests (local master, no UI, few shuffle partitions,
executors running this interpreter so that they can import substreams).
"""

from __future__ import annotations

import os
import sys

from pyspark import SparkConf
from pyspark.sql import SparkSession

from substreams.spark.source import SubstreamsDataSource

# Process-wide: a SparkSession is the JVM's, shared by every caller in this driver process.
_REGISTERED: set[int] = set()


def register(spark: SparkSession) -> SparkSession:
    """Make ``format("substreams")`` available in ``spark`` (once per session)."""
    if id(spark) not in _REGISTERED:
        spark.dataSource.register(SubstreamsDataSource)
        _REGISTERED.add(id(spark))
    return spark


def session(
    app_name: str = "substreams",
    master: str | None = None,
    shuffle_partitions: int = 4,
    jvm_read: bool = True,
    **conf: str,
) -> SparkSession:
    """The active session (or a new one) with the source registered.

    ``master`` defaults to what ``spark-submit`` set, else ``local[*]``.  ``jvm_read`` adds
    Spark's Kafka connector and ``spark-avro`` (the JVM read path of
    :func:`substreams.spark.run`) to ``spark.jars`` -- the jars resolved once per machine,
    see :func:`substreams.spark.connector.kafka_connector_conf` -- unless the JVM is already
    up (under ``spark-submit``, ``substreams submit`` passes them as ``--jars``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Local runs bind to loopback (and Spark stops warning that the hostname does).
    if master is None or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ and not SparkConf().contains("spark.master"):
        # Not under spark-submit (which starts the JVM first and hands its port over): a
        # plain Python run.  Under spark-submit the master is a JVM property that a
        # Python-side SparkConf cannot see before the gateway is up, so checking only the
        # SparkConf set local[*] over `submit --master spark://...`.
        builder = builder.master("local[*]")
    if jvm_read and "PYSPARK_GATEWAY_PORT" not in os.environ:
        from substreams.spark.connector import JARS, PACKAGES, kafka_connector_conf

        conf = {**conf, **kafka_connector_conf(conf.get(PACKAGES), jars=conf.get(JARS))}
    settings = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.log.level": "WARN",
        "spark.ui.showConsoleProgress": "false",
        # Stopping a query mid-batch formats a long task-kill message with a recursive
        # regex (StreamExecution.isInterruptionException) that overflows the default stack.
        "spark.driver.extraJavaOptions": "-Xss16m",
        # Spark's default, made explicit: a micro-batch's tasks run in Python workers kept
        # from the previous batch (no fork, no imports: hundreds of ms per batch otherwise).
        "spark.python.worker.reuse": "true",
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())


def warm_up(spark: SparkSession) -> None:
    """Start the Python worker daemon and import this package in a worker now, so that the
    first real batch does not pay for it (seconds on a busy machine)."""

    def touch(_: int) -> int:
        import substreams.control.ranges  # noqa: F401  (what a read task imports)

        return 0

    spark.sparkContext.parallelize(range(2), 2).map(touch).count()


def jvm_read_available(spark: SparkSession) -> bool:
    """Whether ``spark`` can serve the JVM read path: Spark's Kafka source and
    ``from_avro`` are on its classpath."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        loadable = jvm.org.apache.spark.util.Utils.classIsLoadable
        return all(bool(loadable(c)) for c in (
            "org.apache.spark.sql.kafka010.KafkaSourceProvider",
            "org.apache.spark.sql.kafka010.KafkaSourceRDD",  # jvm_read.direct_frame
            "org.apache.spark.sql.avro.AvroDataToCatalyst",
        ))
    except Exception:  # no JVM gateway (Spark Connect) or a py4j error: not usable here
        return False


def quiet_group_id_warning(spark: SparkSession) -> None:
    """Spark's Kafka source warns on every batch read that sets ``kafka.group.id``
    (consumers of one group would interfere); the JVM read path sets it on purpose to keep
    executor consumers pooled, and its reads ``assign`` partitions (no group membership,
    no offsets committed), so the warning is noise on every batch."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.kafka010.KafkaSourceProvider",
            jvm.org.apache.logging.log4j.Level.ERROR,
        )
    except Exception:  # logging only
        pass
