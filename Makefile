# celery-delayq: `make test` and `make demo` set up everything they need in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: venv test lint demo bench bench-full clean docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The Django and Spark suites run in their own processes (each embeds its own Celery worker
# and JVM); the last pass repeats the store and end-to-end suites on a real Redis Cluster.
test: lint
	$(VENV)/bin/pytest --ignore=tests/django --ignore=tests/spark
	$(VENV)/bin/pytest tests/django
	$(VENV)/bin/pytest tests/spark
	DELAYQ_TEST_STORE=cluster $(VENV)/bin/pytest tests/store tests/carrier

demo: $(STAMP)
	$(PY) -m demo_project.run

# Benchmarks (docs/performance.md): matplotlib and psutil come from the `bench` extra.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench.lateness
	$(PY) -m bench.memory
	$(PY) -m bench.worker_rss
	$(PY) -m bench.flat_cost --pending 1000000
	$(PY) -m bench.lateness_load

# The 10,000,000-pending flat-cost run (~4 GB of Redis memory, ~15 min).
bench-full: $(BENCH_STAMP)
	$(PY) -m bench.flat_cost --pending 10000000

# The documentation site, offline, any warning an error: docs/_build/site/index.html
docs: $(STAMP)
	$(PY) docs/build.py

clean:
	rm -rf $(VENV) .pytest_cache bench/results/*.json
