# Two commands set everything up on a fresh machine: `make up` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install up test test-browser compose-test lint format sim-long chaos fuzz-long fuzz-codec spark-soak bench bench-peers bench-group bench-tiered bench-scale-50k bench-console vendor-console clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The C sources too: an editable install builds the extension in place, once.
NATIVE_SRC := $(wildcard storage/*.c storage/*.h client/*.c client/*.h)

$(STAMP): $(BIN)/python pyproject.toml $(NATIVE_SRC)
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $(STAMP)

install: $(STAMP)

# The dev extra holds moto[server], so the cluster's embedded S3 server (the remote tier)
# runs; without it `cluster up` starts the cluster with no tier and says how to get it.
up: install
	$(BIN)/rillet cluster up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: install lint
	$(BIN)/pytest -q --durations=20 $(PYTEST_ARGS)

# The web console in a real headless Chromium (Debian's `chromium`; the tests skip and
# print the install command without it). Kept out of `make test` for its time budget;
# .ci/run installs Chromium and runs both.
test-browser: install
	$(BIN)/pytest -q -m browser $(PYTEST_ARGS)

# docker-compose.yml for real under podman (no Docker engine here): installs podman and
# runc when missing, makes the Dockerfile's base image available (pulled, or a stand-in
# built from Debian's packages), builds the images, starts the cluster and uses it from
# this host, then tears it all down (tests/test_compose_podman.py, docs/containers.md).
# Root is needed. .ci/run runs it after make test.
compose-test: install
	bash containers/podman-setup.sh
	$(BIN)/pytest -q -s -m compose -p no:cacheprovider tests/test_compose_podman.py $(PYTEST_ARGS)

# Long deterministic-simulator runs, kept out of `make test`: SIM_SEEDS seeds of each of
# the three simulators (about 0.3 s a seed for all three together on one core: ~25 min),
# and fewer under a tiny fd cache (storage SIM_SEEDS/2, replication SIM_SEEDS/4, the
# Log-level fd cache schedules SIM_SEEDS/5: ~15 min more) or with followers fetching
# through fetch sessions (replication SIM_SEEDS/4: ~10 min more).
SIM_SEEDS ?= 5000
SIMULATORS = tests/test_group_sim.py tests/test_group_client_sim.py tests/test_raft_sim.py tests/test_replication_sim.py tests/test_storage_sim.py \
	tests/test_storage_fdcache_random.py
sim-long: install
	RILLET_SIM_SEEDS=$(SIM_SEEDS) $(BIN)/pytest -q -m slow $(SIMULATORS)

# Seeded fault schedules on real processes (RILLET_CHAOS_SEEDS of them, default 100). A
# failing seed's node logs stay in /tmp/rillet-chaos until the next run.
chaos: install
	$(BIN)/pytest -q -s -m slow --basetemp=/tmp/rillet-chaos tests/test_chaos.py

# A streaming Spark load (rillet spark load --stream) for SPARK_SOAK_SECONDS against 3
# controllers + 3 brokers while brokers are killed and restarted, verified live by
# `rillet spark verify --stream` (tests/test_spark_soak.py, docs/spark.md); prints figures.
SPARK_SOAK_SECONDS ?= 180
spark-soak: install
	RILLET_SPARK_SOAK_SECONDS=$(SPARK_SOAK_SECONDS) $(BIN)/pytest -q -s -m slow -p no:cacheprovider tests/test_spark_soak.py

# A million malformed, truncated, oversized, slow and hostile frames at a live broker and
# controller while a good client produces (acks=all) and fetches (~10 min); prints the
# figures. FUZZ_FRAMES sets the count (docs/testing.md, "Fuzzing the network edge").
FUZZ_FRAMES ?= 1000000
fuzz-long: install
	RILLET_FUZZ_FRAMES=$(FUZZ_FRAMES) $(BIN)/pytest -q -s -m slow tests/test_fuzz_long.py

# The C extensions built with AddressSanitizer and UBSan, fuzzed with CODEC_FUZZ damaged
# and random inputs per seed (skipped without gcc's libasan; docs/testing.md).
CODEC_FUZZ ?= 1000000
fuzz-codec: install
	RILLET_CODEC_FUZZ=$(CODEC_FUZZ) $(BIN)/pytest -q -s -m slow tests/test_recordcodec_sanitizers.py

# Benchmarks print JSON; each measures its own baseline in the same run.
bench: install
	@for b in benchmarks/*_bench.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# rillet next to Redis Streams and NATS JetStream on the same work (also part of
# `bench`). The peers need Debian's redis-server and nats-server and the peers extra:
#   apt-get install redis-server nats-server && .venv/bin/pip install -e '.[peers]'
bench-peers: install
	$(BIN)/python benchmarks/peers_bench.py

# Consumer groups alone (also part of `bench`): a one-member group consumer against a
# plain consumer, and rebalance times when a member joins and when one is killed -9.
bench-group: install
	$(BIN)/python benchmarks/group_bench.py

# The remote tier against local disk on one cluster with its embedded S3 server (moto):
# cold remote reads vs local reads, upload throughput, broker memory with the cache full.
bench-tiered: install
	$(BIN)/python benchmarks/tiered_bench.py

# The web console on 10,000 partitions and 1,000 groups: page latencies (p50/p99) and
# the snapshot's refresh times (docs/console.md, "Scale").
bench-console: install
	$(BIN)/python benchmarks/console_bench.py

# The slow partition-scale run: 50,000 partitions must come up healthy, however slowly.
bench-scale-50k: install
	$(BIN)/python benchmarks/scale_bench.py --steps 1000 49000 --timeout-s 7200

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache storage/*.so client/*.so

# Refresh the console's vendored scripts from their npm packages (versions pinned here
# and in client/console/static/vendor/VENDORED.md); needs node and npm.
CONSOLE_VENDOR := client/console/static/vendor
vendor-console:
	rm -rf /tmp/rillet-vendor && mkdir -p /tmp/rillet-vendor
	cd /tmp/rillet-vendor && npm init -y >/dev/null && \
		npm install --silent htmx.org@2.0.11 htmx-ext-sse@2.2.4 uplot@1.6.32
	cp /tmp/rillet-vendor/node_modules/htmx.org/dist/htmx.min.js $(CONSOLE_VENDOR)/
	cp /tmp/rillet-vendor/node_modules/htmx.org/LICENSE $(CONSOLE_VENDOR)/htmx.LICENSE
	cp /tmp/rillet-vendor/node_modules/htmx-ext-sse/dist/sse.min.js $(CONSOLE_VENDOR)/htmx-ext-sse.min.js
	cp /tmp/rillet-vendor/node_modules/htmx-ext-sse/LICENSE $(CONSOLE_VENDOR)/htmx-ext-sse.LICENSE
	cp /tmp/rillet-vendor/node_modules/uplot/dist/uPlot.iife.min.js /tmp/rillet-vendor/node_modules/uplot/dist/uPlot.min.css $(CONSOLE_VENDOR)/
	cp /tmp/rillet-vendor/node_modules/uplot/LICENSE $(CONSOLE_VENDOR)/uPlot.LICENSE
