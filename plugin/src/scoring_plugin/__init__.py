"""vLLM plugin of the scoring service.

Everything that must run inside vLLM lives here, so the same pip package serves both our gRPC
server (which calls the IO processors in-process) and stock ``vllm serve`` (``/pooling``).
"""
