# inferwatch — two commands: `make test` and `make demo`. Both install what they need first:
# a .venv with the package and its test extras, and (as root, via apt-get) Prometheus and Alertmanager.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
APT_PACKAGES := prometheus prometheus-alertmanager docker-compose victoria-metrics postgresql
PYTEST_ARGS ?=
ARGS ?=
SEED ?=

.PHONY: test test-fast test-loaded test-lifetimes lint demo chaos install system-deps bench aiperf-venv litellm-venv generate check-generated clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Debian packages for the real Prometheus/promtool and Alertmanager/amtool the tests start, and VictoriaMetrics
# (victoria-metrics, vmagent, vmalert) for the central-store tests. Nothing runs (no root needed) when every
# binary is already on PATH; otherwise apt-get installs them, which needs root.
SYSTEM_BINARIES := prometheus promtool prometheus-alertmanager amtool docker-compose victoria-metrics vmagent vmalert
system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "missing:$$missing; install as root: apt-get install -y $(APT_PACKAGES)" >&2; exit 1; \
	  fi; \
	  echo "installing Debian packages: $(APT_PACKAGES) (missing:$$missing)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi

# Everything but the HA chaos scenario (`make chaos`, about five minutes), so the suite stays under 20 minutes.
test: install system-deps check-generated
	$(BIN)/pytest -m "not chaos" --durations=30 $(PYTEST_ARGS)

# The same suite with one core kept busy, as on a developer's machine doing other work: a CPU burner starts
# first and stops on any exit of the recipe (trap), pass, failure or Ctrl-C; the burner also leaves by itself
# when this shell dies (it spins on its parent pid). Prints the exit status and the wall time.
# Every parent the product has SIGKILLed 20 times in a row, no child left (make test kills each 3 times).
test-lifetimes: install
	INFERWATCH_LIFETIME_RUNS=20 $(BIN)/pytest tests/test_process_lifetimes.py $(PYTEST_ARGS)

test-loaded: install system-deps check-generated
	@$(PYTHON) -c 'import itertools, os; p = os.getppid(); any(os.getppid() != p for _ in itertools.count())' & \
	burner=$$!; \
	trap 'kill $$burner 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	echo "test-loaded: CPU burner pid $$burner keeps one core busy"; start=$$(date +%s); \
	$(BIN)/pytest -m "not chaos" $(PYTEST_ARGS); rc=$$?; \
	echo "test-loaded: pytest exit $$rc, wall $$(( $$(date +%s) - start )) s (one core busy)"; exit $$rc

# ruff (rules in pyproject.toml) on every Python file, then mypy on the package (src/inferwatch, laid out as
# it is imported).
LINT_STAMP := $(VENV)/.lint-stamp
lint: $(LINT_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy src
	$(BIN)/mkdocs build --strict --quiet

$(LINT_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[lint]'
	touch $@

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

# NVIDIA AIPerf for benchmarks/gateway_aiperf.py, in its own venv: its dependencies (transformers, pydantic,
# zmq) stay out of .venv, and `make test` never needs it. The script creates it too when missing.
aiperf-venv: .venv-aiperf/bin/aiperf

.venv-aiperf/bin/aiperf:
	$(PYTHON) -m venv .venv-aiperf
	.venv-aiperf/bin/pip install --quiet 'aiperf==0.13.0' 'tokenizers>=0.20'

# LiteLLM's proxy, the metering gateway benchmarks/gateway_overhead.py compares against when this venv exists.
litellm-venv: .venv-litellm/bin/litellm

.venv-litellm/bin/litellm:
	$(PYTHON) -m venv .venv-litellm
	.venv-litellm/bin/pip install --quiet 'litellm[proxy]'

generate: install
	$(BIN)/inferwatch generate

clean:
	rm -rf $(VENV) .venv-aiperf .venv-litellm .demo .pytest_cache

# The HA chaos scenario (a few minutes): two Prometheus replicas, three Alertmanager peers, two notifiers on
# one PostgreSQL outbox, a storm of ~500 alerts, one SIGKILL of each kind, a notifier SIGSTOPped past the
# webhook timeout and a PostgreSQL fast restart; prints its figures. SEED=n replays a run (default: random).
chaos: install system-deps
	INFERWATCH_CHAOS_SEED=$(SEED) $(BIN)/pytest -m chaos -s -p no:cacheprovider tests/test_ha_chaos.py $(PYTEST_ARGS)
