# celery-delayq: `make test` and `make demo` set up everything they need in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: venv test lint demo bench clean docs

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

bench: $(STAMP)
	$(PY) -m bench.lateness

# The documentation site, offline, any warning an error: docs/_build/site/index.html
docs: $(STAMP)
	$(PY) docs/build.py

clean:
	rm -rf $(VENV) .pytest_cache bench/results/*.json
