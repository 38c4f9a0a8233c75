"""``scoring-parity``: the conversion check teams run on their own checkpoints.

It runs the Hugging Face reference and the plugin path (the server's own engine and IO-processor
code, no network) on the same inputs and reports how far they agree: fp32 reference vs plugin,
single-item vs batched requests, fp32 vs the serving dtype.
"""
