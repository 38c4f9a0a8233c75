"""Summarises a py-spy raw profile (`py-spy record --format raw --threads --subprocesses --idle`)
per process and thread: where the wall time of each thread goes, by function, inclusive and self.

A flame graph answers "what is hot"; this answers "how many milliseconds of a call does each
stage take", which is what a per-call host budget needs:

    BENCH_PROFILE=prof python3 rerank.py --systems grpc ...   # py-spy around each server
    (or: py-spy record --subprocesses --threads --idle --nonblocking -r 100 --format raw -o prof.txt -- CMD)
    python3 profile_summary.py prof/grpc-server.pyspy.txt --within run_busy_loop --top 25
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter, defaultdict
from pathlib import Path

# py-spy's own frames lead each stack: the process chain (command lines may hold ";"), then the
# thread; the code frames follow, outermost first.
_PROCESS = re.compile(r'process (\d+):"([^"]*)";?')
_THREAD = re.compile(r"thread \((\d+)\)(?:: ([^;]*))?;?")
_LINE = re.compile(r" \(([^()]*):\d+\)$")


def _function(frame: str) -> str:
    """`name (path/file.py:123)` -> `name (file.py)`: lines of one function add up."""
    match = _LINE.search(frame)
    if match is None:
        return frame
    return f"{frame[: match.start()]} ({Path(match.group(1)).name})"


def summarise(path: Path, top: int, min_share: float, within: str) -> str:
    # (process label, thread) -> samples; and inclusive / self counters per function
    totals: Counter[tuple[str, str]] = Counter()
    inclusive: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    own: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    for raw in text.decode(errors="replace").splitlines():
        stack, _, count = raw.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        label, rest = "?", stack
        while match := _PROCESS.match(rest):
            label, rest = f"{match.group(2)[:80]} [{match.group(1)}]", rest[match.end():]
        thread = "thread ?"
        if match := _THREAD.match(rest):
            thread, rest = f"thread {match.group(1)} {match.group(2) or ''}", rest[match.end():]
        key = (label, thread)
        code = [_function(f) for f in rest.split(";") if f]
        if within and not any(name.startswith(f"{within} ") for name in code):
            continue
        n = int(count)
        totals[key] += n
        for name in set(code):
            inclusive[key][name] += n
        if code:
            own[key][code[-1]] += n
    grand = sum(totals.values())
    lines: list[str] = []
    for key, samples in totals.most_common():
        if samples < min_share * grand:
            continue
        label, thread = key
        lines.append(f"\n== {label} {thread}: {samples} samples")
        lines.append("   inclusive (share of this thread):")
        for name, n in inclusive[key].most_common(top):
            lines.append(f"   {100 * n / samples:6.1f}%  {name}")
        lines.append("   self:")
        for name, n in own[key].most_common(max(5, top // 3)):
            lines.append(f"   {100 * n / samples:6.1f}%  {name}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--within", default="", help="only stacks through this function, e.g. run_busy_loop")
    parser.add_argument("--min-share", type=float, default=0.02, help="hide threads below this share of samples")
    args = parser.parse_args()
    print(summarise(args.profile, args.top, args.min_share, args.within))


if __name__ == "__main__":
    main()
