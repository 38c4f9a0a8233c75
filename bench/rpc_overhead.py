"""What one unary gRPC call costs outside any scoring work, on this machine: a trivial echo RPC
at c=1 through a bare ``grpc.aio`` server, and through the same server with the interceptors our
server installs (telemetry: metrics, access log, tracing span; error mapping), each server in
its own process, the client in this one. At c=1 the benches' client latency sits 1.4-1.6 ms
above the sum of our server's stages on the H200 host; this says how much of that any Python
gRPC call pays and how much our interceptors add. Servers run in turn within each round, the
order alternating between rounds; each is timed back to back and with the client idle between
calls (what a c=1 call finds on a host that slows down after a wait). A profile to choose the
next change by, not a throughput claim. ``--breakdown`` adds servers with each interceptor
alone and ours with the access-log line off. ``--base-site DIR`` adds our interceptors as another
build has them (its packages installed to DIR; a build from this bench's commit on, which has
``scoring_server.app.interceptors``), for a change measured against its base in one run.

    python bench/rpc_overhead.py [--calls 2000] [--rounds 4] [--idle-ms 8] [--breakdown] [--base-site DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import free_port, log, site_environment, start, stop

BARE, OURS, BASE = "bare grpc.aio", "with our interceptors", "with the base build's interceptors"
# --breakdown: which part of our interceptors costs what.
NOOP, ERRORS, TELEMETRY, UNLOGGED = (
    "two interceptors that do nothing", "error mapping alone", "telemetry alone", "ours, access log off",
)
BREAKDOWN = (NOOP, ERRORS, TELEMETRY, UNLOGGED)
METHOD = "/scoring.bench.Echo/Call"  # not one of the services our access log leaves out
PAYLOAD = b"x" * 256


async def serve(port: int, mode: str) -> None:
    import logging

    import grpc

    interceptors: list[grpc.aio.ServerInterceptor] = []
    if mode != BARE:  # as ScoringServer installs them (no auth), logging as its CLI configures it
        from scoring_server.app import interceptors as server_interceptors
        from scoring_server.cli import configure_logging
        from scoring_server.errors import ErrorMappingInterceptor
        from scoring_server.interception import BehaviorInterceptor
        from scoring_server.security import AuthSettings
        from scoring_server.telemetry import TelemetryInterceptor

        class Passing(BehaviorInterceptor):
            def wrap_unary(self, behavior: Any, method: str) -> Any:
                async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
                    return await behavior(request, context)

                return wrapped

        configure_logging("info", "text")
        interceptors = {
            NOOP: lambda: [Passing(), Passing()],
            ERRORS: lambda: [ErrorMappingInterceptor()],
            TELEMETRY: lambda: [TelemetryInterceptor()],
        }.get(mode, lambda: server_interceptors(AuthSettings()))()
        if mode == UNLOGGED:
            logging.getLogger("scoring_server.access").setLevel(logging.WARNING)

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    service, method = METHOD.strip("/").split("/")
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(echo)}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def timed_calls(port: int, calls: int, idle_s: float) -> list[float]:
    """Latency of ``calls`` calls one after another over one channel, after a warm-up."""
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD)
        await channel.channel_ready()
        for _ in range(100):
            await call(PAYLOAD)
        latencies = []
        for _ in range(calls):
            if idle_s:
                await asyncio.sleep(idle_s)
            began = time.perf_counter()
            assert await call(PAYLOAD) == PAYLOAD
            latencies.append(time.perf_counter() - began)
        return latencies


async def measure(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Latencies by server and idle time (ms), pooled over the rounds."""
    work = Path(tempfile.mkdtemp(prefix="rpc-overhead-"))
    servers = (BARE, OURS) + ((BASE,) if args.base_site else ()) + (BREAKDOWN if args.breakdown else ())
    ports = {name: free_port() for name in servers}
    processes = [
        start([sys.executable, __file__, "--serve", OURS if name == BASE else name, "--port", str(ports[name])],
              work / f"server-{i}.log", site_environment(args.base_site) if name == BASE else None)
        for i, name in enumerate(servers)
    ]
    results: dict[str, dict[str, list[float]]] = {name: {} for name in servers}
    try:
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for name in order:
                for idle_ms in (0.0, args.idle_ms):
                    latencies = await asyncio.wait_for(timed_calls(ports[name], args.calls, idle_ms / 1e3), 600)
                    results[name].setdefault(f"{idle_ms:g}", []).extend(latencies)
            log(f"round {rnd + 1} of {args.rounds} done")
    finally:
        for process in processes:
            stop(process)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per server, idle time and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--idle-ms", type=float, default=8.0, help="the client's wait between calls, second column")
    parser.add_argument("--out", type=Path, help="also write the table as JSON here")
    parser.add_argument("--base-site", help="also our interceptors from the packages installed in this directory")
    parser.add_argument("--breakdown", action="store_true",
                        help="also servers with each interceptor alone, and ours with the access log off")
    parser.add_argument("--serve", choices=(BARE, OURS, *BREAKDOWN), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port, args.serve))
        return
    results = asyncio.run(measure(args))
    rows: dict[str, dict[str, Any]] = {}
    for name, by_idle in results.items():
        for idle, latencies in by_idle.items():
            rows[f"{name}, idle {idle} ms"] = {
                "p50_us": statistics.median(latencies) * 1e6,
                "mean_us": statistics.fmean(latencies) * 1e6,
                "calls": len(latencies),
            }
    print(f"\nOne unary echo RPC at c=1 ({len(PAYLOAD)} bytes each way), {args.rounds} rounds of {args.calls} calls\n")
    print("| server, client idle between calls | p50 us | mean us | p50 minus bare us |")
    print("|---|---|---|---|")
    for key, row in rows.items():
        bare = rows[BARE + key[key.index(", idle"):]]["p50_us"]
        print(f"| {key} | {row['p50_us']:,.0f} | {row['mean_us']:,.0f} | {row['p50_us'] - bare:+,.0f} |")
    if args.out:
        args.out.write_text(json.dumps({"calls": args.calls, "rounds": args.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
