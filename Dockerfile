# One image for every pidlease service, built from this repository:
#   target "pidlease" (the default): the coordinator, the partition server and the CLI;
#   target "spark": the same plus a Java runtime and PySpark, for a Spark master/worker
#                   whose Python workers can run the pidlease data source.
# docker-compose.yml builds both. Every service runs as the unprivileged user "pidlease".

FROM python:3.11-slim-bookworm AS pidlease
RUN useradd --system --create-home --home-dir /home/pidlease pidlease \
 && mkdir -p /var/lib/pidlease \
 && chown pidlease:pidlease /var/lib/pidlease
WORKDIR /opt/pidlease
COPY pyproject.toml README.md ./
COPY pidlease ./pidlease
COPY coordinator ./coordinator
COPY partition_server ./partition_server
# Not editable: the image holds a built package (with coordinator/static, the dashboard's
# assets, as package data).
RUN pip install --no-cache-dir . \
 && python -c "import coordinator.dashboard as d; assert d.load_static(), 'dashboard assets missing'"
USER pidlease
ENV PIDLEASE_DATA_DIR=/var/lib/pidlease \
    PYTHONUNBUFFERED=1
# 8470 coordinator HTTP (API, /dashboard, /metrics); 8480 partition server; 9480 its /metrics
EXPOSE 8470 8480 9480
VOLUME ["/var/lib/pidlease"]
CMD ["pidlease", "--help"]

FROM pidlease AS spark
USER root
# procps: Spark's launch scripts call ps.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir ".[spark]"
USER pidlease
ENV SPARK_NO_DAEMONIZE=1 \
    PYSPARK_PYTHON=python3
