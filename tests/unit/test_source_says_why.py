"""Source says why, not when: comments and docstrings carry no lab-notebook history.

A comment that cites a benchmark run ("run15"), the machine it ran on ("on the H200"), a date, or
a measured figure ("3.1 ms", "3,488 pairs/s", "~6% of the FLOPs") is stale the day the next run
lands, and nobody re-runs a comment. Measured figures live in `docs/performance.md` and the
decision records `docs/decisions/`; the source states the mechanism (why a choice is right, what
would go wrong otherwise) and points there.

This guard scans comments and docstrings only, never code or string literals: `#` comments (via
`tokenize`) and module/class/function docstrings (via `ast`) of the Python packages under
`plugin/src`, `server/src` and `clients/python/src/scoring_client`; `//` and `/* */` comments of
`clients/java/src/**/*.java`; `#` comments of the shell scripts under `plugin/`, `server/` and
`clients/`. The patterns are narrow on purpose: the code's own specifications (limits, defaults,
tolerances, shapes such as "capped at 256 MiB", "default 8192 tokens", "within 1e-5") pass. A
legitimate comment that trips one should be reworded; there is no allow-list.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.servers import REPO

PYTHON_ROOTS = ("plugin/src", "server/src", "clients/python/src/scoring_client")
JAVA_ROOT = "clients/java/src"
SHELL_ROOTS = ("plugin", "server", "clients")
# Build outputs and environments, never source (the generated stubs under clients/python/src/scoring
# are outside PYTHON_ROOTS already).
SKIPPED_DIRS = {".venv", "venv", "target", "build", "dist", "__pycache__", "node_modules"}

# A benchmark run number: "run7", "run15's", "Run 15", "(run 22)". Glued to a number, "run" is only
# ever a label. With a space it may be the verb ("run 2 workers", "run 4 engines"), so the spaced
# form counts only where the number ends the phrase: before "'s", punctuation, the end of the text,
# or a linking word ("run 15 gave", "run 7 against run 9"), never before a counted noun.
RUN_NUMBER = re.compile(
    r"\brun(?:\d+|[ ]\d+(?='s\b|[^\w\s-]|\s*$|\s+(?:and|or|vs|versus|against|on|with|in|at|from|"
    r"of|to|for|gave|got|had|has|was|were|is|showed|shows|measured|found)\b))",
    re.IGNORECASE,
)

# GPU models, as a host or a card ("on the H200", "H100s", "bench/results/...-h200-..."). L4 is
# also the networking layer ("an L4 balancer", "L4/L7"), so it counts only outside that sense.
GPU_NAME = re.compile(
    r"(?<![A-Za-z0-9])(?:GH200|GB200|H100|H200|H800|A100|A800|B100|B200|V100|L40S?)(?![0-9])",
    re.IGNORECASE,
)
L4_GPU = re.compile(
    r"(?<![A-Za-z0-9/])L4(?![0-9A-Za-z])(?!\s*(?:/\s*L7|or\s+L7|load[ -]?balanc|balanc|LB\b|proxy|"
    r"routing|switch|network))"
)
# An unnamed machine is a host name all the same.
DEV_MACHINE = re.compile(r"\b(?:dev|my|our|the test)\s+(?:machine|box|laptop|workstation)\b", re.IGNORECASE)

# Dates: ISO ("2025-03-14", "2025-03") and "<Month> 20xx" ("March 2025", "Mar. 14, 2025").
ISO_DATE = re.compile(r"\b20\d\d-(?:0[1-9]|1[0-2])(?:-(?:0[1-9]|[12]\d|3[01]))?\b")
MONTH_YEAR = re.compile(
    r"\b(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?\s+(?:\d{1,2},?\s+)?20\d\d\b"
)

# A measured figure: a number with a time or throughput unit ("1.9 ms", "88.6 us", "3,488 pairs/s",
# "67 TFLOP/s", "3.1 TB/s"), a speed-up ("1.8x faster", "13x speed-up"), or an approximate figure
# ("~35", "~2^-22", "~3e-6"). Seconds are left out: timeouts and limits are specified in them.
_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
FIGURE_WITH_UNIT = re.compile(
    _NUMBER + r"\s?(?:(?:pairs|img|images|docs|documents|calls|requests|req|tokens|items)/s\b"
    r"|[TGM]FLOP/?s\b|[KMGT]B/s\b|(?:ms|us|µs|μs|ns)\b)"
)
SPEED_UP = re.compile(_NUMBER + r"\s?x\s+(?:faster|slower|speed-?ups?\b|quicker|the throughput)", re.IGNORECASE)
APPROXIMATE = re.compile(r"[~≈]\s?\d")

PATTERNS: dict[str, re.Pattern[str]] = {
    "run number": RUN_NUMBER,
    "GPU name": GPU_NAME,
    "L4 GPU": L4_GPU,
    "machine": DEV_MACHINE,
    "ISO date": ISO_DATE,
    "month and year": MONTH_YEAR,
    "measured figure": FIGURE_WITH_UNIT,
    "speed-up": SPEED_UP,
    "approximate figure": APPROXIMATE,
}

Comment = tuple[int, str]  # (1-based line, text)


def _files(root: Path, pattern: str) -> Iterator[Path]:
    for path in sorted(root.rglob(pattern)):
        if not SKIPPED_DIRS.intersection(path.relative_to(REPO).parts):
            yield path


def python_comments(source: str) -> list[Comment]:
    """`#` comments and the docstrings of the module, its classes and its functions."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            found += [(first.lineno + i, line) for i, line in enumerate(first.value.value.split("\n"))]
    return found


def java_comments(source: str) -> list[Comment]:
    """`//` and `/* */` comments (Javadoc included), one entry per line, skipping string, text
    block and char literals."""
    found: list[Comment] = []
    i, line, n = 0, 1, len(source)
    while i < n:
        if source.startswith('"""', i):  # text block
            end = source.find('"""', i + 3)
            end = n if end < 0 else end + 3
        elif source[i] in "\"'":
            quote, end = source[i], i + 1
            while end < n and source[end] != quote and source[end] != "\n":
                end += 2 if source[end] == "\\" else 1
            end += 1
        elif source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            found.append((line, source[i:end]))
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            found += [(line + k, text) for k, text in enumerate(source[i:end].split("\n"))]
        else:
            if source[i] == "\n":
                line += 1
            i += 1
            continue
        line += source.count("\n", i, end)
        i = end
    return found


def shell_comments(source: str) -> list[Comment]:
    """`#` comments: from a `#` at the start of a word outside quotes to the end of the line
    (the shebang excluded; `${#array[@]}` and `$#` are not comments)."""
    found: list[Comment] = []
    for number, text in enumerate(source.split("\n"), start=1):
        if number == 1 and text.startswith("#!"):
            continue
        quote = ""
        for k, char in enumerate(text):
            if quote:
                if char == quote:
                    quote = ""
                elif char == "\\" and quote == '"':
                    continue
            elif char in "'\"":
                quote = char
            elif char == "#" and (k == 0 or text[k - 1] in " \t;|&("):
                found.append((number, text[k:]))
                break
    return found


def source_comments() -> Iterator[tuple[Path, Comment]]:
    for root in PYTHON_ROOTS:
        for path in _files(REPO / root, "*.py"):
            for comment in python_comments(path.read_text(encoding="utf-8")):
                yield path, comment
    for path in _files(REPO / JAVA_ROOT, "*.java"):
        for comment in java_comments(path.read_text(encoding="utf-8")):
            yield path, comment
    for root in SHELL_ROOTS:
        for path in _files(REPO / root, "*.sh"):
            for comment in shell_comments(path.read_text(encoding="utf-8")):
                yield path, comment


def lab_notes(text: str) -> list[str]:
    """The kinds of history `text` holds, with what matched: [] for a comment that says why."""
    return [f"{kind} {match.group(0)!r}" for kind, pattern in PATTERNS.items() for match in pattern.finditer(text)]


def test_comments_and_docstrings_say_why_not_when() -> None:
    hits = []
    scanned = 0
    for path, (line, text) in source_comments():
        scanned += 1
        found = lab_notes(text)
        if found:
            hits.append(f"{path.relative_to(REPO)}:{line}: {text.strip()}  [{'; '.join(found)}]")
    assert scanned > 100, f"only {scanned} comment lines found: the scan is not reading the sources"
    assert not hits, (
        "comments and docstrings cite runs, hosts, dates or measured figures; state the design reason "
        "and point to docs/decisions/ or docs/performance.md instead:\n" + "\n".join(hits)
    )


@pytest.mark.parametrize(
    "text",
    [
        "# 3.1 ms on the H200 (run15)",
        "(bench/results/fp32-gemm-h200-run11.md)",
        "the gather was slower in run 15.",
        "run22's numbers",
        "Run 7 gave the same scores",
        "c=16 3,191 -> 3,488 pairs/s",
        "88.6 us per layer",
        "65 µs for Q and K, 3.1 TB/s",
        "13.6 ms at ~33 of the H200's 67 TFLOP/s",
        "~6% of the GPU's bf16 FLOPs",
        "made the call 1.8x faster",
        "a fake 13x speed-up",
        "H100s and A100s",
        "on an L4",
        "measured on 2025-03-14",
        "as of March 2025",
        "on the dev machine",
    ],
)
def test_patterns_catch_lab_notes(text: str) -> None:
    assert lab_notes(text), text


@pytest.mark.parametrize(
    "text",
    [
        "# capped at 256 MiB",
        "default 8192 tokens per step, not the library's 2048",
        "run 2 workers per GPU",
        "we run 4 engines on one host",
        "runs 3 times; rerun 5",
        "within 1e-5 of the reference",
        "chosen where it is at least 3% faster",
        "retry_after_ms: the retry hint",
        ":data:`~.kernel_choice.MARGIN` faster than ``unfused``",
        "an L4 load balancer spreads connections, as L4/L7 proxies do",
        "Latency buckets from a millisecond to ten seconds",
        "fetch_timeout_s: 5 s for the whole fetch",
        "Step sizes timed, in tokens: 256 then x4 up to and including max_rows",
        "a 336x336 image; 132 SMs; 544 x 1,024 in 128 x 128 tiles",
        "vLLM 0.32.0's ColBERTModel",
        "sm_90 without a GPU; Hopper's FA3",
    ],
)
def test_patterns_pass_specifications(text: str) -> None:
    assert not lab_notes(text), lab_notes(text)


def test_the_scanners_read_comments_only() -> None:
    python = 'x = "3.1 ms on the H200"  # why: one copy\n\ndef f() -> None:\n    """run15"""\n'
    assert python_comments(python) == [(1, "# why: one copy"), (4, "run15")]
    java = 'String s = "// run7"; // a comment\n/* one\n * two */ char c = \'"\';\n'
    assert java_comments(java) == [(1, "// a comment"), (2, "/* one"), (3, " * two */")]
    shell = '#!/usr/bin/env bash\necho "# not" ${#a[@]} # said\n# whole line\n'
    assert shell_comments(shell) == [(2, "# said"), (3, "# whole line")]
