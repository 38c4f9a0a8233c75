"""Hugging Face reference implementations of the architectures the plugin serves.

Plain transformers + torch, no vLLM: they define what "correct" means for parity tests and let
teams check their own checkpoints.
"""
