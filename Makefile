# Two commands matter: `make test` and `make demo`. Both install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo lint bench services venv clean

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
# healthcheck, systemd-analyze verify), chromium (the dashboard's browser test).
NEEDED := mosquitto:mosquitto mosquitto_sub:mosquitto-clients redis-server:redis-server \
          systemd-analyze:systemd chromium:chromium

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

lint: $(STAMP)
	$(VENV)/bin/ruff check rsnotify tests bench

test: $(STAMP) services lint
	$(VENV)/bin/pytest -q

bench: $(STAMP) services
	$(PY) -m bench.parse

demo: $(STAMP) services
	$(PY) -m rsnotify.demo

clean:
	rm -rf $(VENV) .demo .pytest_cache bench/results
