"""gRPC scoring server: contracts from ``proto/``, engines from vLLM, logic from the plugin."""

__version__ = "0.1.0"
