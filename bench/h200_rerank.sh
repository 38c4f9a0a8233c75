#!/bin/sh
# The rerank measurements of one H200 staging, in device-tool calls of <= 10 minutes each
# (`../shared/gpu/README.md` stages vLLM first). Results and logs land in $OUT.
#   sh bench/h200_rerank.sh systems   # HF, vllm serve /rerank, vllm serve /pooling + plugin and
#                                     # ours in one run (~7 min): docs/performance.md's rerank table
#   sh bench/h200_rerank.sh published # the same shape as Qwen3-Reranker is published (Qwen3ForCausalLM):
#                                     # ours (recognized, packed) and vllm serve /rerank (with the
#                                     # hf_overrides vLLM prescribes), c=1/16/64 and one document, c=16
#                                     # at short and long pairs; the packed path's parity (bf16 and
#                                     # fp32) against the model card's formula (~6 min)
#   FAMILY=bert sh bench/h200_rerank.sh family  # another packed family at its published shape
#                                     # (bert: ms-marco MiniLM-L-12, xlmr: bge-reranker-v2-m3,
#                                     # modernbert: gte-reranker-modernbert-base): HF,
#                                     # vllm serve /rerank and ours, c=1/16/64 and one document, c=16
#                                     # at short (~50-token) and long (~420-token) pairs; then the
#                                     # packed path's parity (bf16 and fp32) against the fp32
#                                     # reference, 4 queries x 20 documents (~5 min)
#   sh bench/h200_rerank.sh parity    # the packed path's parity alone, bf16 and fp32 against the fp32
#                                     # reference, 4 queries x 20 of the bench's documents, on FAMILY's
#                                     # model (default qwen3), or with PUBLISHED=1 on Qwen3-Reranker as
#                                     # published (~3 min)
#   sh bench/h200_rerank.sh check     # parity bf16 of the packed path against the fp32 HF
#                                     # reference, and the HF reference's own bf16 orderings (~3.5 min)
#   sh bench/h200_rerank.sh fp32-parity  # float32 with 3xTF32 projections against IEEE float32 and
#                                     # the HF reference, packed, 4 queries x 20 documents; run after
#                                     # `check`, which builds the model (~2.5 min)
#   sh bench/h200_rerank.sh fp32      # float32: ours IEEE, ours with 3xTF32 projections, vllm serve
#                                     # /rerank (IEEE), c=1 and 16, 20 documents (~5 min)
#   sh bench/h200_rerank.sh ab        # this tree against a base build (.whl-base: wheels of the
#                                     # base commit), both servers up at once, their levels
#                                     # interleaved for AB_ROUNDS rounds (default 3): c=1/16/64 at 20
#                                     # documents, c=1 at one document, AB_SECONDS (default 8) per
#                                     # level; the A/B table (~5 min)
#   sh bench/h200_rerank.sh gpu-tests # every GPU-only test of the plugin's kernels (segment attention,
#                                     # Q/K norm + rotary, gate/up + activation, MLP fusions, 3xTF32)
#                                     # and of the unit tier (nvJPEG pixels)
#                                     # (needs the pytest, pluggy and iniconfig wheels in .whl) (~3 min)
#   sh bench/h200_rerank.sh timeline  # the device's timeline while ours serves c=16, then c=64 (in
#                                     # process, vLLM's torch profiler, CUDA activity only): busy
#                                     # time, idle gaps, idle between steps, top kernels (~4 min)
#   sh bench/h200_rerank.sh pack      # ours at pack_tokens 8192 (the server's default), 16384 (the
#                                     # bench's) and 24576: c=16 and c=64, 20 documents (~5 min)
#   sh bench/h200_rerank.sh inline    # ours with inline planning (the default) and without
#                                     # (`grpc-threads`), c=1, 20 and 1 documents (~3.5 min)
#   sh bench/h200_rerank.sh variants  # ours with async scheduling asked for explicitly (the packed
#                                     # default); scoring-parity --pack-pairs in bf16
# `family` and `published` take CONCURRENCY (e.g. 16: only the loads a run still lacks; default the
# scenario's 1,16,64), DOCS_SWEEP ("" for none; default 1) and, for `family`, SYSTEMS.
# The base build's wheels come from .whl-base, or the directory WHL_BASE names (relative to the
# project's root), so one staging can hold two bases; WHL_BASE=.whl is an A/A run (this tree on
# both sides: what the harness itself tilts between its two servers).
set -eu
. bench/h200_env.sh
cd bench

# queries_jsonl QUERIES: /tmp/queries.jsonl, QUERIES x 20 documents of the bench's requests
queries_jsonl() {
    python3 -c "import json, rerank; print('\n'.join(json.dumps({'query': q, 'documents': d}) for q, d in rerank.make_requests($1, 20, seed=11)))" > /tmp/queries.jsonl
}

# packed_parity QUERIES JSON FLAGS...: scoring-parity on the packed path of the model `check`
# built, QUERIES x 20 documents of the bench's requests, served with FLAGS
packed_parity() {
    queries=$1 json=$2
    shift 2
    queries_jsonl "$queries"
    python3 -m scoring_server.parity --checkpoint /tmp/scoring-rerank-check/model-qwen3-0.6b-shaped --inputs /tmp/queries.jsonl \
        "$@" --pack-pairs --json "$OUT/$json" 2>&1 | tail -30
}

# packed_dtypes_parity MODEL OUT: scoring-parity of the packed path in bf16 and in fp32 against the
# fp32 reference (the checkpoint's own: sentence-transformers' formula, or the model card's for a
# published Qwen3-Reranker), 4 queries x 20 of the bench's documents. One run, served in bf16:
# scoring-parity serves fp32 first whatever the dtype (reference vs fp32, fp32 single vs
# batched), then bf16 against that; a second run asking for fp32 would repeat the first half.
packed_dtypes_parity() {
    queries_jsonl 4
    python3 -m scoring_server.parity --checkpoint "$1" --inputs /tmp/queries.jsonl \
        --pack-pairs --dtype bfloat16 --json "$2/parity-packed-bfloat16.json" 2>&1 | tail -14
}

case "$1" in
check)
    python3 rerank_check.py --queries 6 --out "$OUT" 2>&1 | tail -14
    python3 reference_dtype_check.py --queries 6 --out "$OUT" 2>&1 | tail -9
    ;;
systems)
    python3 rerank.py --systems hf,grpc,vllm,plugin --seconds-per-level 8 --docs-sweep 1 --work /tmp/bw \
        --out "$OUT" 2>&1 | tail -40
    ;;
family)
    shown "^Rerank," "$OUT/$FAMILY.log" python3 rerank.py --family "$FAMILY" --systems "${SYSTEMS:-hf,grpc,vllm}" --seconds-per-level 6 \
        ${CONCURRENCY:+--concurrency "$CONCURRENCY"} --docs-sweep "${DOCS_SWEEP-1}" --length-sweep short,long \
        --work "/tmp/bw-$FAMILY" --out "$OUT/$FAMILY"
    packed_dtypes_parity /tmp/bw-"$FAMILY"/model-* "$OUT/$FAMILY"
    ;;
parity)
    model=$(python3 rerank.py --build-only --family "${FAMILY:-qwen3}" ${PUBLISHED:+--published} --work /tmp/bw-parity | tail -1)
    mkdir -p "$OUT/parity"
    packed_dtypes_parity "$model" "$OUT/parity"
    ;;
published)
    shown "^Rerank," "$OUT/published.log" python3 rerank.py --published --systems grpc,vllm --seconds-per-level 8 ${CONCURRENCY:+--concurrency "$CONCURRENCY"} \
        --docs-sweep "${DOCS_SWEEP-1}" --length-sweep short,long \
        --work /tmp/bw-published --out "$OUT/published"
    packed_dtypes_parity /tmp/bw-published/model-* "$OUT/published"
    ;;
variants)
    python3 rerank.py --systems grpc --grpc-engine-args '{"async_scheduling": true}' --work /tmp/bw \
        --out "$OUT/async" 2>&1 | tail -25
    packed_parity 6 parity-packed-bf16.json --dtype bfloat16
    ;;
inline)
    shown "^| system" "$OUT/inline.log" python3 rerank.py --systems grpc,grpc-threads --concurrency 1 --docs-sweep 1 --seconds-per-level 8 \
        --work /tmp/bw --out "$OUT"
    ;;
ab)
    install_base
    shown "^| system" "$OUT/ab.log" python3 rerank.py --systems grpc,grpc-base --base-site /tmp/site-base --ab-rounds "${AB_ROUNDS:-3}" --docs-sweep 1 \
        --seconds-per-level "${AB_SECONDS:-8}" --work /tmp/bw --out "$OUT/ab"
    # Each side's start-up kernel plans: near a margin two starts can choose differently, which
    # moves the loaded levels by a few percent (docs/performance.md, harness noise).
    for side in grpc grpc-base; do
        echo "$side: $(grep -h "MLP fusions" /tmp/bw/$side-server.log | sed 's/.*residual at \(.*\) (\[{.*plan /residual \1, gate\/up plan /')"
    done
    ;;
pack)
    for tokens in 8192 16384 24576; do
        shown "^| grpc" "$OUT/pack-$tokens.log" python3 rerank.py --systems grpc --pack-tokens "$tokens" --concurrency 16,64 --docs-sweep "" \
            --seconds-per-level 8 --work /tmp/bw --out "$OUT/pack-$tokens"
    done
    ;;
fp32)
    shown "^| system" "$OUT/fp32.log" python3 rerank.py --dtype float32 --systems grpc,grpc-tf32x3,vllm --concurrency 1,16 --docs-sweep "" \
        --seconds-per-level 6 --work /tmp/bw --out "$OUT/fp32"
    grep -h "3xTF32" /tmp/bw/grpc-tf32x3-server.log | cut -c1-300 || true
    ;;
fp32-parity)
    packed_parity 4 rerank-parity-packed-fp32-tf32x3.json --dtype float32 --float32-matmul-precision tf32x3
    ;;
gpu-tests)
    (cd .. && python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/unit)
    ;;
timeline)
    for c in 16 64; do
        shown "^Device timeline" "$OUT/timeline-c$c.log" python3 gpu_timeline.py --concurrency "$c" --work /tmp/bw --out "$OUT"
    done
    ;;
esac
