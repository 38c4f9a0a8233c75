"""What each launch shape of the Triton segment kernel (`scoring_plugin.models.segment_attention`)
costs an H100/H200 streaming multiprocessor, compiled ahead of time for sm_90 on any machine
(no GPU needed; Triton's bundled ptxas and cuobjdump): registers per thread, shared memory per
program, and how many programs one SM can hold by each (the smaller one bounds occupancy).
Rerank's shapes: Qwen3-0.6B's head size 128, two query heads per KV head, bf16.

The kernel's step is latency-bound (a ~135-row segment meets 1-5 key tiles), so programs in
flight per SM matter as much as tile efficiency: a table to choose what
`bench/attention_variants.py` should time on the H200, not a timing.

    python bench/segment_kernel_resources.py [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attention_variants import TILINGS, tiling_name
from scoring_plugin.models.segment_attention import Tiling, _segment_attention_kernel

# sm_90 per SM: 64k 32-bit registers, 228 KB shared memory (1 KB of it reserved per program),
# at most 64 warps.
REGISTERS, SHARED_BYTES, WARPS = 65536, 228 * 1024, 64
HEAD_DIM, QUERIES_PER_KV = 128, 2
POINTERS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16",
            "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "key_starts_ptr": "*i32"}
SCALARS = {"q_stride": "i32", "k_stride": "i32", "v_stride": "i32", "out_stride": "i32", "scale_log2": "fp32"}
# Q's norm + rotary on load: positions, the norm's weight, the rotary cache and its row stride, eps.
ROPE = {"positions_ptr": "*i64", "q_weight_ptr": "*bf16", "cos_sin_ptr": "*bf16", "cos_sin_stride": "i32",
        "eps": "fp32"}


def compiled(tiling: Tiling, norm_rope_q: bool = False) -> tuple[int, int, int]:
    """(shared bytes per program, registers per thread, spilled bytes per thread) of the kernel
    compiled for sm_90, with Q's norm + rotary on load where asked."""
    constants = {"QUERIES_PER_KV": QUERIES_PER_KV, "HEADS_PER_PROGRAM": tiling.heads_per_program,
                 "END_ALIGNED": tiling.end_aligned, "HEAD_DIM": HEAD_DIM, "DIM_TILE": HEAD_DIM,
                 "BLOCK_M": tiling.block_m, "BLOCK_N": tiling.block_n, "NORM_ROPE_Q": norm_rope_q}
    signature = {**POINTERS, **SCALARS, **ROPE, **dict.fromkeys(constants, "constexpr")}
    names = list(signature)
    divisible = [names.index(name) for name in (*POINTERS, *SCALARS, *ROPE) if name not in ("scale_log2", "eps")]
    source = ASTSource(
        fn=_segment_attention_kernel, signature=signature,
        constexprs={(names.index(name),): value for name, value in constants.items()},
        # Pointers and strides divisible by 16, as the served tensors' are (Triton specialises so).
        attrs={(i,): [["tt.divisibility", 16]] for i in divisible},
    )
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": tiling.num_warps, "num_stages": tiling.num_stages})
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as work:
        cubin = Path(work) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    registers, local = re.search(r"REG:(\d+)", usage), re.search(r"LOCAL:(\d+)", usage)
    assert registers is not None and local is not None, usage
    return int(kernel.metadata.shared), int(registers.group(1)), int(local.group(1))


def per_sm(shared: int, registers: int, warps: int) -> tuple[int, int]:
    """Programs one SM holds by registers (allocated in units of 8 per thread, 256 per warp)
    and by shared memory, each also within the SM's warp limit."""
    per_warp = -(-registers // 8) * 8 * 32
    by_registers = REGISTERS // (per_warp * warps)
    by_shared = SHARED_BYTES // (shared + 1024)
    return min(by_registers, WARPS // warps), min(by_shared, WARPS // warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset
    lines = [
        f"Segment kernel compiled for sm_90 with Triton {triton.__version__} (head size {HEAD_DIM}, "
        f"{QUERIES_PER_KV} query heads per KV head, bf16)", "",
        "| tiling | query rows per program | shared KB per program | registers per thread (spilled bytes) "
        "| programs per SM by registers / shared memory | query rows in flight per SM |",
        "|---|---|---|---|---|---|",
    ]
    served = Tiling.served(QUERIES_PER_KV)
    for tiling, norm_rope_q in [*((t, False) for t in TILINGS), (served, True)]:
        shared, registers, spilled = compiled(tiling, norm_rope_q)
        by_registers, by_shared = per_sm(shared, registers, tiling.num_warps)
        rows = tiling.block_m * tiling.heads_per_program
        name = tiling_name(tiling) + (", Q norm + rotary on load" if norm_rope_q else "")
        lines.append(f"| {name} | {rows} | {shared / 1024:.0f} | {registers} ({spilled}) "
                     f"| {by_registers} / {by_shared} | {rows * min(by_registers, by_shared)} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
