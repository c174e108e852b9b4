# One image for every rillet node; the command line picks the role.
# The build stage has a C compiler, so the wheel carries the native append path
# (storage/_batchwrite.c) and record codec (client/_recordcodec.c); the runtime image
# installs that wheel and needs none.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY client ./client
COPY storage ./storage
COPY controller ./controller
COPY broker ./broker
COPY tools ./tools
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
WORKDIR /opt/rillet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels rillet \
    && python -c "from rillet.storage import batchwrite; assert batchwrite.NATIVE" \
    && python -c "from rillet.client.wire import records; assert records.NATIVE" \
    && rm -rf /wheels \
    && useradd --create-home rillet && mkdir /data && chown rillet /data
USER rillet
VOLUME /data
ENTRYPOINT ["rillet"]
CMD ["--help"]
