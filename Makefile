# inferwatch — two commands: `make test` and `make demo`. Both install what they need first:
# a .venv with the package and its test extras, and (as root, via apt-get) Prometheus and Alertmanager.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
APT_PACKAGES := prometheus prometheus-alertmanager docker-compose victoria-metrics
PYTEST_ARGS ?=
ARGS ?=

.PHONY: test test-fast demo install system-deps bench generate check-generated clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Debian packages for the real Prometheus/promtool and Alertmanager/amtool the tests start, and VictoriaMetrics
# (victoria-metrics, vmagent, vmalert) for the central-store tests.
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null \
	    || ! command -v amtool >/dev/null || ! command -v docker-compose >/dev/null \
	    || ! command -v vmalert >/dev/null; then \
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
