"""The HTTP front door: Cohere's and TEI's rerank APIs, and our own messages as proto3 JSON, on
their own port (`ServerSettings.http_port`) beside gRPC, in the same process and on the same
request path (validation, limits, admission, metrics, tracing, auth)."""
