# The two set-up commands of the README. Both create or refresh the CPU environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 50051

.PHONY: env java-toolchain demo test lint

env:
	SCORING_INSTALL_EDITABLE=1 deploy/install-cpu.sh $(VENV)

# Debian's offline Java toolchain for the Java client's build and tests (apt-get; root).
java-toolchain:
	clients/java/install-offline-toolchain.sh

# The service on its embedded default: CPU, fp32, demo models built under .demo-models/.
demo: env
	$(PY) -m scoring_server --demo --port $(PORT)

# Every test: contract lint and compatibility, units, parity, end to end (Python client, Java
# client, grpcurl, vllm serve), deploy manifests, lifecycle.
test: env java-toolchain
	$(PY) -m pytest tests

lint: env
	PATH="$(VENV)/bin:$$PATH" proto/buf.sh lint
