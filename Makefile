# Two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean images system-tools

# Three programs the test suite drives and pip cannot bring: Debian's chromium (the dashboard's
# browser tests, through Playwright, never a downloaded browser), promtool (the alert rules
# of deploy/monitoring, from Debian's prometheus package) and pgbouncer (runners and clients
# through transaction pooling; it lives in /usr/sbin). Installed only when missing, and only
# by root (CI, a container: `apt-get install`, said before it runs). Anyone else is told what
# is missing, why and how to install it, and the suite runs without the tests that need it
# (their paths are written to $(SKIPPED) for the pytest line of `test`).
SYSTEM_PACKAGES := chromium prometheus pgbouncer
SKIPPED := $(VENV)/.skipped-tests
system-tools: $(STAMP)
	@missing=""; skip=""; \
	command -v chromium >/dev/null || { missing="$$missing chromium"; \
		skip="$$skip --ignore=tests/browser"; }; \
	command -v promtool >/dev/null || { missing="$$missing prometheus"; \
		skip="$$skip --ignore=tests/integration/test_monitoring_rules.py"; }; \
	{ command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; } || { \
		missing="$$missing pgbouncer"; skip="$$skip --ignore=tests/integration/test_pgbouncer.py"; }; \
	: > $(SKIPPED); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "make test: installing Debian's$$missing as root (apt-get; see README, Try it)" >&2; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; exit $$?; fi; \
	echo "make test: missing$$missing (chromium: the dashboard's browser tests; prometheus:" \
		"promtool, the alert rules; pgbouncer: transaction pooling). Not root, so nothing is" \
		"installed: install them with \`sudo apt-get install -y$$missing\` (Debian, Ubuntu)." \
		"Running the suite without:$$skip" | sed 's/--ignore=//g' >&2; \
	echo "$$skip" > $(SKIPPED)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/shigoto demo

# Three pytest workers on two cores: the suite mostly waits (timers, subprocesses, the
# database), using about 1.3 cores of CPU in its wall time; a third worker fills the waits.
# Measured on this 2-core machine: -n 2 309 s, -n 3 226 s and 243 s, both green; -n 4 199 s
# but timing-bound tests failed under the CPU contention.
test: $(STAMP) system-tools
	$(BIN)/ruff check runner operator tests tools
	$(BIN)/lint-imports
	$(BIN)/pytest -q -n 3 $$(cat $(SKIPPED))

bench: $(STAMP)
	$(BIN)/shigoto bench

# The runner, operator and example images (docs/images.md). On your own base image:
#   make images PYTHON_IMAGE=registry.internal/python:3.11 DOCKER_BUILD_FLAGS='--network host'
images: IMAGE_TAG ?= 0.1.0
images:
	docker build $(DOCKER_BUILD_FLAGS) $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
		-f Dockerfile.runner -t shigoto-runner:$(IMAGE_TAG) .
	docker build $(DOCKER_BUILD_FLAGS) $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
		-f Dockerfile.operator -t shigoto-operator:$(IMAGE_TAG) .
	docker build $(DOCKER_BUILD_FLAGS) --build-arg SHIGOTO_RUNNER_IMAGE=shigoto-runner:$(IMAGE_TAG) \
		-t shigoto-example:$(IMAGE_TAG) deploy/examples
	docker image ls --filter 'reference=shigoto-*:$(IMAGE_TAG)'

clean:
	rm -rf $(VENV) .shigoto dist
