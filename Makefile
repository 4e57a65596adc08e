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

# Mosquitto and Redis come from Debian packages when their binaries are absent.
# Tests and the demo start their own instances on free loopback ports; the
# packaged services are never started or stopped here.
services:
	@command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || { \
	  echo "installing mosquitto from Debian packages"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mosquitto; }
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server from Debian packages"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; }
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium from Debian packages (the dashboard's browser test)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core; }

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
