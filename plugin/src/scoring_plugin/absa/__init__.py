"""Aspect-based sentiment: settings, heads, span decoding and request types."""
