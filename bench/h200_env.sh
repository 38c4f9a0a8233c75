# Sourced by bench/h200_*.sh on the device: vLLM staged by ../shared/gpu (install is skipped
# when done), our wheels from .whl on top, spawned engine workers (CUDA after fork breaks them).
sh .gpu/bin/install.sh >/dev/null
. .gpu/bin/env.sh
python3 -m pip install -q --no-deps --upgrade --target /tmp/site .whl/*.whl
export VLLM_WORKER_MULTIPROC_METHOD=spawn

# install_base: the base build's wheels (.whl-base, or the directory WHL_BASE names, relative to
# the project's root) into /tmp/site-base, a bench's --base-site for an A/B; run from bench/
install_base() {
    python3 -m pip install -q --no-deps --upgrade --target /tmp/site-base "../${WHL_BASE:-.whl-base}"/*.whl
}

. bench/shown.sh
