# inferwatch — two commands: `make test` and `make demo`. Both install what they need first:
# a .venv with the package and its test extras, and (as root, via apt-get) Prometheus and Alertmanager.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
APT_PACKAGES := prometheus prometheus-alertmanager docker-compose
PYTEST_ARGS ?=
ARGS ?=
SEED ?=

.PHONY: test test-fast demo chaos install system-deps bench generate check-generated clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Debian packages for the real Prometheus/promtool and Alertmanager/amtool the tests start.
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null \
	    || ! command -v amtool >/dev/null || ! command -v docker-compose >/dev/null; then \
	  echo "installing Debian packages: $(APT_PACKAGES)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi

test: install system-deps check-generated
	$(BIN)/pytest $(PYTEST_ARGS)

# Generated files (rules, dashboards, deploy configs) are committed: fail when they are stale.
check-generated: install
	$(BIN)/inferwatch generate --check

# Everything but the slow end-to-end scenarios.
test-fast: install system-deps
	$(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

demo: install system-deps
	$(BIN)/inferwatch demo $(ARGS)

# Benchmarks print figures (final JSON line each); nginx is the reference proxy for the gateway benchmark.
bench: install system-deps
	@command -v nginx >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; }
	@for b in benchmarks/*.py; do case $$b in */triton_capture.py|*/triton_replay.py) continue;; esac; \
	  echo "== $$b"; $(BIN)/python $$b || exit 1; done

generate: install
	$(BIN)/inferwatch generate

clean:
	rm -rf $(VENV) .demo .pytest_cache

# The HA chaos scenario (a few minutes): two Prometheus replicas, three Alertmanager peers, two notifiers, a
# storm of ~500 alerts and one SIGKILL of each kind; prints its figures. SEED=n replays a run (default: random).
chaos: install system-deps
	INFERWATCH_CHAOS_SEED=$(SEED) $(BIN)/pytest -m slow -s -p no:cacheprovider tests/test_ha_chaos.py $(PYTEST_ARGS)
