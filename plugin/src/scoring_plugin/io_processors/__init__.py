"""IO processors registered under ``vllm.io_processor_plugins``."""
