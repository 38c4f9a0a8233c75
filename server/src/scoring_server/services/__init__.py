"""gRPC servicers, one module per service of ``proto/scoring/v1``."""
