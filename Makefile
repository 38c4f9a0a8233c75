# The two set-up commands of the README. Both create or refresh the CPU environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 50051

# Tests run on pytest-xdist workers (tests/README.md: how the tiers share engines across them).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

.PHONY: env java-toolchain demo test test-fast lint

env:
	SCORING_INSTALL_EDITABLE=1 deploy/install-cpu.sh $(VENV)

# Debian's offline Java toolchain for the Java client's build and tests (apt-get; root).
java-toolchain:
	clients/java/install-offline-toolchain.sh

# The service on its embedded default: CPU, fp32, demo models built under .demo-models/.
# HTTP_PORT=8080 also opens the HTTP APIs (README: HTTP).
demo: env
	$(PY) -m scoring_server --demo --port $(PORT) $(if $(HTTP_PORT),--http-port $(HTTP_PORT))

# Every test, every tier (tests/README.md): unit, kernels, engine, server, clients, deploy, bench.
test: env java-toolchain
	$(PYTEST) tests

# After every change: unit tests, the Triton kernels on the interpreter, one engine smoke per kind.
test-fast: env
	$(PYTEST) -m "unit or kernels or smoke" tests/unit tests/kernels tests/engine

lint: env
	PATH="$(abspath $(VENV))/bin:$$PATH" proto/buf.sh lint
