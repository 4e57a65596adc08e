# Two commands matter: `make test` and `make demo`. Both install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo lint bench services venv clean chaos soak fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# System tools come from Debian packages, installed only when missing:
# mosquitto and redis-server (tests and the demo start their own instances on
# free loopback ports; packaged services are never started or stopped here),
# mosquitto-clients and systemd (deploy/ validation: mosquitto_sub in compose's
# healthcheck, systemd-analyze verify), chromium (the dashboard's browser test),
# nginx (a stock static Source for tests and bench.http_detect: started with its
# own config and prefix, the packaged service is never used), openssl (the
# private CA of the HTTPS Source test) and nats-server (the second MQTT broker:
# MQTT 3.1.1 over JetStream, stricter topics).
NEEDED := mosquitto:mosquitto mosquitto_sub:mosquitto-clients redis-server:redis-server \
          systemd-analyze:systemd chromium:chromium \
          nginx:nginx openssl:openssl nats-server:nats-server

services:
	@missing=""; for pair in $(NEEDED); do \
	  bin=$${pair%%:*}; pkg=$${pair#*:}; \
	  command -v $$bin >/dev/null 2>&1 || [ -x /usr/sbin/$$bin ] || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing from Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $$missing fonts-dejavu-core; \
	fi

# mypy: strict on the modules pyproject.toml lists, the default level elsewhere.
lint: $(STAMP)
	$(VENV)/bin/ruff check rsnotify tests bench
	$(VENV)/bin/ruff format --check rsnotify tests bench
	$(VENV)/bin/mypy

# Four worker processes on two cores: the tests mostly wait on brokers, servers and
# subprocesses they start (each on its own free ports), so they overlap well.  Every
# test passes alone too: `.venv/bin/pytest tests/test_x.py` runs in one process.
# worksteal: a worker that runs dry takes tests from a busy one (the slowest take 30-60 s).
TEST_WORKERS ?= 4
test: $(STAMP) services lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist worksteal

bench: $(STAMP) services
	$(PY) -m bench.parse

# Fault matrix (issue 8): every fault for CHAOS_MINUTES in total; writes chaos-report.json.
# Needs root for the disk-full (tmpfs) and network-partition (ip netns) scenarios.
CHAOS_MINUTES ?= 10
chaos: $(STAMP) services
	$(PY) -m tests.chaos --minutes $(CHAOS_MINUTES)

# Soak (not in CI): SOAK_MINUTES at SOAK_RATE changes/s with SOAK_CLIENTS WebSocket
# clients; RSS/fds sampled every minute; writes soak/soak-report.json and soak/soak.png.
SOAK_MINUTES ?= 30
SOAK_RATE    ?= 500
SOAK_CLIENTS ?= 200
soak: $(STAMP) services
	$(PY) -m tests.chaos.soak --minutes $(SOAK_MINUTES) --rate $(SOAK_RATE) \
	  --clients $(SOAK_CLIENTS) --out soak

# Fuzzers (issue 8) for FUZZ_MINUTES in total: the hypothesis fuzzers of tests/fuzz,
# plus coverage-guided atheris runs when it is installed (pip install atheris).
# `make test` runs the same fuzzers for a bounded number of examples.
FUZZ_MINUTES ?= 10
fuzz: $(STAMP)
	$(PY) -m tests.fuzz --minutes $(FUZZ_MINUTES)

demo: $(STAMP) services
	$(PY) -m tests.demo

clean:
	rm -rf $(VENV) .demo .pytest_cache bench/results
