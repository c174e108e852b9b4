# One image for every rillet node; the command line picks the role.
FROM python:3.11-slim
WORKDIR /opt/rillet
COPY pyproject.toml README.md ./
COPY client ./client
COPY storage ./storage
COPY controller ./controller
COPY broker ./broker
RUN pip install --no-cache-dir . && useradd --create-home rillet && mkdir /data && chown rillet /data
USER rillet
VOLUME /data
ENTRYPOINT ["rillet"]
CMD ["--help"]
