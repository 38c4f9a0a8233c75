#!/bin/sh
# The ABSA measurements of one H200 staging (`../shared/gpu/README.md` stages vLLM first);
# results and logs land in $OUT.
#   sh bench/h200_absa.sh parity [SERVED]  # packed path vs the HF reference (fp32 gated), served
#                                          # as bf16 (default), fp32-tf32 (TF32 matmuls) or
#                                          # fp32-tf32x3 (3xTF32 projections)
#   sh bench/h200_absa.sh systems [SYSTEMS]  # default: ours packed, ours unpacked, stock
#                                            # /classify in one run (bench/absa.py --systems)
#   sh bench/h200_absa.sh fp32      # the fp32 scenario: ours packed (padded-batch SDPA, piecewise
#                                   # graphs) and stock /classify, eager as the issue's baseline
#   sh bench/h200_absa.sh frontends [N]  # ours with one and with N (default 4) gRPC front-end
#                                        # processes, and stock /classify, in one run (~6 min)
#   sh bench/h200_absa.sh c1        # c=1 only: one process; 4 front-ends over 1 connection; over 16
#   sh bench/h200_absa.sh baselines # HF, vllm serve /pooling + plugin, stock /classify and ours
#                                   # (one process) in one run, c=1 and 32, 6 s per level (~6 min)
#   sh bench/h200_absa.sh inline    # ours with inline planning (the default) and without
#                                   # (`grpc-threads`), c=1 and c=32, twice (~6 min)
#   sh bench/h200_absa.sh tf32      # fp32: ours and stock /classify, each with IEEE and with TF32
#                                   # matmuls (float32_matmul_precision high), c=1 and 32 (~6 min)
#   sh bench/h200_absa.sh tf32x3    # fp32: ours with IEEE matmuls, with 3xTF32 projections
#                                   # (float32_matmul_precision tf32x3) and with TF32, stock /classify
#                                   # IEEE, c=1 and 32; the 3xTF32 GPU test (~8 min)
#   sh bench/h200_absa.sh ab        # this tree against a base build (.whl-base: wheels of the base
#                                   # commit), both servers up at once, c=1 and 32 (AB_CONCURRENCY)
#                                   # interleaved for AB_ROUNDS rounds (default 3), AB_SECONDS
#                                   # (default 8) per level, the A/B table (~5 min);
#                                   # AB_SCENARIO=fp32 for the fp32 model
#   sh bench/h200_absa.sh tf32-ab   # fp32 with TF32 matmuls, this tree against a base build (.whl-base),
#                                   # both servers up at once, c=1 and 32 interleaved for AB_ROUNDS
#                                   # rounds (default 3): is run11's TF32 c=1 (20.5 ms against run6's
#                                   # 12.5) the code since run6 (base 25797e3) or the host? (~6 min)
# The base build's wheels come from .whl-base, or the directory WHL_BASE names (relative to the
# project's root), so one staging can hold two bases.
set -eu
. bench/h200_env.sh
cd bench
case "$1" in
parity)
    served="${2:-bf16}"
    case "$served" in
    bf16) scenario=bf16 flags="--dtype bfloat16" ;;
    fp32-tf32) scenario=fp32 flags="--dtype float32 --float32-matmul-precision high" ;;
    fp32-tf32x3) scenario=fp32 flags="--dtype float32 --float32-matmul-precision tf32x3" ;;
    *) echo "served: bf16, fp32-tf32 or fp32-tf32x3" >&2; exit 2 ;;
    esac
    model=$(python3 -c "
import json; from pathlib import Path; import absa
model, _ = absa.build_models(absa.SCENARIOS['$scenario'], Path('/tmp/bw'))
rows = [{'aspect': a, 'review': r} for call in absa.make_requests(8, 8, seed=3) for a, r in call]
Path('/tmp/absa-pairs.jsonl').write_text(''.join(json.dumps(row) + '\\n' for row in rows))
print(model)" | tail -1)
    # shellcheck disable=SC2086
    python3 -m scoring_server.parity --checkpoint "$model" --inputs /tmp/absa-pairs.jsonl $flags --pack-pairs \
        --max-model-len 512 --json "$OUT/absa-parity-packed-h200-$served.json" 2>&1 | tail -32
    ;;
tf32x3)
    (cd .. && python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_tf32x3_gemm.py 2>&1 | tail -3)
    python3 absa.py --scenario fp32 --systems grpc,grpc-tf32x3,grpc-tf32,classify --concurrency 1,32 \
        --seconds-per-level 6 --work /tmp/bw --out "$OUT" 2>&1 | tail -30
    grep -h "3xTF32" /tmp/bw/absa-grpc-tf32x3-server.log | cut -c1-400 || true
    ;;
tf32)
    python3 absa.py --scenario fp32 --systems grpc,grpc-tf32,classify,classify-tf32 --concurrency 1,32 \
        --seconds-per-level 6 --work /tmp/bw --out "$OUT" 2>&1 | tail -24
    ;;
systems)
    python3 absa.py --systems "${2:-grpc,grpc-unpacked,classify}" --seconds-per-level 8 --work /tmp/bw \
        --out "$OUT" 2>&1 | tail -30
    ;;
fp32)
    python3 absa.py --scenario fp32 --systems grpc,classify --seconds-per-level 8 --work /tmp/bw \
        --out "$OUT" 2>&1 | tail -30
    ;;
frontends)
    python3 absa.py --systems grpc,grpc-frontends,classify --frontends "${2:-4}" --seconds-per-level 8 \
        --work /tmp/bw --out "$OUT" 2>&1 | tail -30
    ;;
c1)
    shown "^| system" "$OUT/c1-one-connection.log" python3 absa.py --systems grpc,grpc-frontends --channels 1 --concurrency 1 --seconds-per-level 8 \
        --work /tmp/bw --out "$OUT/one-connection"
    shown "^| system" "$OUT/c1-sixteen-connections.log" python3 absa.py --systems grpc-frontends --concurrency 1 --seconds-per-level 8 \
        --work /tmp/bw --out "$OUT/sixteen-connections"
    ;;
baselines)
    python3 absa.py --systems hf,grpc,plugin,classify --concurrency 1,32 --seconds-per-level 6 --work /tmp/bw \
        --out "$OUT" 2>&1 | tail -24
    ;;
inline)
    for round in 1 2; do
        shown "^| system" "$OUT/inline-$round.log" python3 absa.py --systems grpc,grpc-threads --concurrency 1,32 --seconds-per-level 8 \
            --work /tmp/bw --out "$OUT/inline-$round"
    done
    ;;
ab)
    install_base
    shown "^| system" "$OUT/ab.log" python3 absa.py --systems grpc,grpc-base --base-site /tmp/site-base --ab-rounds "${AB_ROUNDS:-3}" \
        --scenario "${AB_SCENARIO:-bf16}" --concurrency "${AB_CONCURRENCY:-1,32}" --seconds-per-level "${AB_SECONDS:-8}" \
        --work /tmp/bw --out "$OUT/ab"
    # Each side's start-up kernel plans: near a margin two starts can choose differently, which
    # moves the loaded levels by a few percent (docs/performance.md, harness noise).
    for side in grpc grpc-base; do
        echo "$side: $(grep -h "MLP fusions" /tmp/bw/absa-$side-server.log | sed 's/.*residual at \(.*\) (\[{.*plan /residual \1, gate\/up plan /')"
    done
    ;;
tf32-ab)
    install_base
    shown "^| system" "$OUT/tf32-ab.log" python3 absa.py --scenario fp32 --systems grpc-tf32,grpc-base-tf32 --base-site /tmp/site-base \
        --ab-rounds "${AB_ROUNDS:-3}" --concurrency 1,32 --seconds-per-level 6 --work /tmp/bw --out "$OUT/tf32-ab"
    ;;
esac
