# The substreams image: Python 3.11, Java 17 (for PySpark) and the project, installed as a
# wheel (its protocol schemas are package data); /app keeps the configs, jobs and the
# streams' schemas (avro/).
# One image serves every role in docker-compose.yml: acker, producer, Spark master/worker
# (pyspark ships spark-class), and job submission.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java

ENV JAVA_HOME=/opt/java \
    PYSPARK_PYTHON=python3 \
    PYTHONUNBUFFERED=1 \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    SUBSTREAMS_CONFIG=/app/jobs/substreams.cluster.yaml \
    SUBSTREAMS_HOME=/var/lib/substreams

WORKDIR /app
COPY pyproject.toml README.md ./
COPY substreams ./substreams
RUN pip install --no-cache-dir . && substreams --help >/dev/null
COPY avro ./avro
COPY jobs ./jobs
COPY substreams.yaml ./

ENTRYPOINT ["tini", "--"]
CMD ["substreams", "--help"]
