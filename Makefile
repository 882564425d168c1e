# celery-delayq: `make test` and `make demo` set up everything they need in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: venv test lint demo bench bench-full clean docs test-matrix test-lowest test-django-ends test-install test-slow test-fuzz test-celery-suite dist

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The core suite runs in $(CORE_PROCESSES) processes (pytest-xdist: most of its time is spent
# waiting on servers, workers and carriers, so three share two CPUs well), each test file in
# one process, in its order. The HTTP callback, Django and Spark suites run in processes of
# their own: each embeds a Celery worker of its own app (and Spark a JVM), and a process runs
# one app's workers (tests/conftest.py, running_worker). The last pass repeats the store and
# end-to-end suites on a real Redis Cluster.
CORE_PROCESSES ?= 3
SUITES_APART := --ignore=tests/django --ignore=tests/spark --ignore=tests/http
test: lint
	$(VENV)/bin/pytest $(SUITES_APART) -n $(CORE_PROCESSES) --dist loadfile
	$(VENV)/bin/pytest tests/http -n 2 --dist loadfile
	$(VENV)/bin/pytest tests/django
	$(VENV)/bin/pytest tests/spark
	DELAYQ_TEST_STORE=cluster $(VENV)/bin/pytest tests/store tests/carrier

# The version matrix (noxfile.py; the last run's table is in docs/compatibility.md): the core
# suite on the declared floors (Python 3.10) and on the newest releases (Python 3.13), and the
# Django and Spark suites on both ends of their ranges. Virtualenvs in .nox/, made with uv.
test-matrix: $(STAMP)
	$(VENV)/bin/nox

# One pass of the core suite on the declared floors: what .ci/run adds to `make test`.
test-lowest: $(STAMP)
	$(VENV)/bin/nox -s 'core(lowest)'

# The Django app's suite on Django 4.2 LTS with the declared floors and on the newest
# releases (noxfile.py, ~4 min): their admin pages are laid out differently (the browser test).
test-django-ends: $(STAMP)
	$(VENV)/bin/nox -s 'django(lowest)' 'django(latest)'

# The long runs, opt-in so `make test` stays short (.ci/run runs them, ~3 min): fault soaks
# (a carrier SIGKILLed five times, a Sentinel failover, a full Redis drained) and the Spark
# runs in processes of their own (a retried task, a stage retry, spark-submit).
test-slow: $(STAMP)
	$(VENV)/bin/pytest -m slow $(SUITES_APART)
	$(VENV)/bin/pytest -m slow tests/spark

# Longer property-based runs (opt-in, ~35 min): ten times the Hypothesis examples of the
# stateful store model (50 steps each; on one Redis and on a cluster), the envelope fuzz and
# the planted-data fuzz (tests/conftest.py, DELAYQ_FUZZ_SCALE).
test-fuzz: $(STAMP)
	DELAYQ_FUZZ_SCALE=10 $(VENV)/bin/pytest --timeout=0 tests/store/test_store_model.py \
		tests/unit/test_envelope_fuzz.py tests/faults/test_planted_data_fuzz.py
	DELAYQ_FUZZ_SCALE=10 DELAYQ_TEST_STORE=cluster $(VENV)/bin/pytest --timeout=0 \
		tests/store/test_store_model.py

# The quickstart from a wheel built from this checkout, in a new virtualenv (tests/compat).
test-install: $(STAMP)
	$(VENV)/bin/pytest -m install tests/compat/test_fresh_install.py

# Celery's own integration suite (from the installed Celery's sdist), natively and with every
# countdown through the store, side by side (tests/compat/celery_suite.py; opt-in, ~40 min).
test-celery-suite: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check pytest-rerunfailures pydantic
	$(PY) -m tests.compat.celery_suite

# The wheel and sdist in dist/, checked as PyPI would check them.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build
	$(VENV)/bin/twine check --strict dist/*

demo: $(STAMP)
	$(PY) -m demo_project.run

# Benchmarks (docs/performance.md): matplotlib and psutil come from the `bench` extra.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench.lateness
	$(PY) -m bench.scheduling
	$(PY) -m bench.worker_events
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
	rm -rf $(VENV) .nox .pytest_cache build dist bench/results/*.json
