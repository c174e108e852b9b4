# One image for every rillet node; the command line picks the role (docs/containers.md).
#   build:      a C compiler builds rillet's wheel, the native append path
#               (storage/_batchwrite.c) and record codec (client/_recordcodec.c) included,
#               and installs it with its dependencies into the venv /opt/venv
#   base:       that venv on a clean base image, no compiler
#   spark:      base + a Java runtime and the spark extra (`docker compose run spark ...`)
#   prometheus: Debian's Prometheus, for the compose file's monitoring profile
#   (last)      the node image: base as the non-root user `rillet`, data in /data (mount a
#               volume there: the compose file gives each node a named one)
# Everything runs from /opt/venv, so the base image may be python:3.11-slim-bookworm or a
# stand-in built from Debian's packages whose own Python refuses system-wide pip installs
# (containers/standin-base.sh).
# Bookworm by name: plain 3.11-slim follows Debian's newest release, whose packages (the
# Java runtime of the spark stage) differ, and the stand-in is bookworm.
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Python's headers: python:3.11-slim has them, Debian's python3 needs python3-dev.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
       $(python3 -c 'import os, sysconfig; print("" if os.path.exists(sysconfig.get_paths()["include"] + "/Python.h") else "python3-dev")') \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY client ./client
COPY storage ./storage
COPY controller ./controller
COPY broker ./broker
COPY tools ./tools
# The s3 extra too: the compose file's S3 service is this image running
# tools/local_s3.py. The venv is what later stages copy (COPY caches on content; a
# bind mount of this stage would not invalidate their cache when the code changes),
# without pip, setuptools or debug symbols, which nothing runs.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && pip install --no-cache-dir "$(ls /wheels/rillet-*.whl)[s3]" \
    && python -c "from rillet.storage import batchwrite; assert batchwrite.NATIVE" \
    && python -c "from rillet.client.wire import records; assert records.NATIVE" \
    && find /opt/venv -name '*.so' -exec strip --strip-unneeded {} + \
    && pip uninstall -q -y pip setuptools

FROM ${PYTHON_IMAGE} AS base
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
RUN useradd --create-home --uid 1000 rillet && mkdir /data && chown rillet /data
WORKDIR /home/rillet

FROM base AS spark
# PySpark runs a JVM; Debian's headless runtime is the smallest that has what it needs.
RUN apt-get update \
    && mkdir -p /usr/share/man/man1 \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
# The spark extra's own pins (pyproject.toml), from the index; rillet from its wheel.
# (The node image's venv has no pip: ensurepip brings the one Python ships.)
COPY --from=build /wheels /tmp/wheels
RUN python -m ensurepip >/dev/null \
    && python -m pip install --no-cache-dir --find-links /tmp/wheels 'rillet[s3,spark]' \
    && rm -rf /tmp/wheels \
    && python -c "import pyspark, rillet.client.spark"
USER rillet
ENV SPARK_LOCAL_IP=127.0.0.1 RILLET_BOOTSTRAP=broker-1:9092,broker-2:9092,broker-3:9092
ENTRYPOINT ["rillet", "spark"]
CMD ["--help"]

FROM ${PYTHON_IMAGE} AS prometheus
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/*
USER nobody
ENTRYPOINT ["prometheus", "--storage.tsdb.path=/tmp/prometheus"]

FROM base
USER rillet
# No VOLUME here: it would give every container without a mount (the console, the CLI,
# init) an anonymous volume that `compose down -v` leaves behind. Nodes mount /data.
ENTRYPOINT ["rillet"]
CMD ["--help"]
