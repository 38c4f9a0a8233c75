# The two set-up commands of the README. Both create or refresh the CPU environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 50051

.PHONY: env demo test lint

env:
	SCORING_INSTALL_EDITABLE=1 deploy/install-cpu.sh $(VENV)

# The service on its embedded default: CPU, fp32, demo models built under .demo-models/.
demo: env
	$(PY) -m scoring_server --demo --port $(PORT)

# Every test: contract lint, units, parity, end to end (Python client, grpcurl, vllm serve).
test: env
	$(PY) -m pytest tests

lint: env
	PATH="$(VENV)/bin:$$PATH" proto/lint.sh
