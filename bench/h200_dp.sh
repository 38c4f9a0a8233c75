#!/bin/sh
# Issue 42's measurement on the two-GPU kind (nvidia-h200-x2 / nvidia-h100-x2), after staging
# vLLM as ../shared/gpu/README.md says: one GPU against two in the same run, then the packed
# path's parity on each GPU. Results and logs land in $OUT.
#   sh bench/h200_dp.sh rerank   # Qwen3-0.6B shape, 20 documents: ours with one engine core and
#                                # with two (data_parallel_size 2), c=16 and 64 (~4 min)
#   sh bench/h200_dp.sh absa     # ModernBERT-large shape, 8 pairs: the same at c=32 and 64 (~4 min)
#   sh bench/h200_dp.sh parity   # rerank and ABSA packed bf16 against the fp32 reference, on GPU 0
#                                # and on GPU 1 (run after rerank and absa, which build the models)
set -eu
. bench/h200_env.sh
cd bench
case "$1" in
rerank)
    shown "^Rerank," "$OUT/dp-rerank.log" python3 rerank.py --systems grpc,grpc-dp --data-parallel-size 2 --concurrency 16,64 --docs-sweep "" \
        --seconds-per-level 8 --work /tmp/bw-dp --out "$OUT/dp"
    ;;
absa)
    shown "^| system" "$OUT/dp-absa.log" python3 absa.py --systems grpc,grpc-dp --data-parallel-size 2 --concurrency 32,64 --seconds-per-level 8 \
        --work /tmp/bw-dp --out "$OUT/dp"
    ;;
parity)
    python3 -c "import json, rerank; print('\n'.join(json.dumps({'query': q, 'documents': d}) for q, d in rerank.make_requests(4, 20, seed=11)))" > /tmp/queries.jsonl
    python3 -c "
import json; from pathlib import Path; import absa
rows = [{'aspect': a, 'review': r} for call in absa.make_requests(8, 8, seed=3) for a, r in call]
Path('/tmp/absa-pairs.jsonl').write_text(''.join(json.dumps(row) + '\\n' for row in rows))"
    for gpu in 0 1; do
        CUDA_VISIBLE_DEVICES=$gpu python3 -m scoring_server.parity --checkpoint /tmp/bw-dp/model-qwen3-0.6b-shaped \
            --inputs /tmp/queries.jsonl --pack-pairs --dtype bfloat16 --json "$OUT/dp/parity-rerank-gpu$gpu.json" 2>&1 | tail -8
        CUDA_VISIBLE_DEVICES=$gpu python3 -m scoring_server.parity --checkpoint /tmp/bw-dp/absa-modernbert-large-shaped-bfloat16 \
            --inputs /tmp/absa-pairs.jsonl --pack-pairs --dtype bfloat16 --max-model-len 512 \
            --json "$OUT/dp/parity-absa-gpu$gpu.json" 2>&1 | tail -8
    done
    ;;
*)
    echo "usage: sh bench/h200_dp.sh rerank|absa|parity" >&2
    exit 2
    ;;
esac
