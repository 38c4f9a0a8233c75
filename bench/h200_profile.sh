#!/bin/sh
# Where a call's time goes on the H200 host, outside the model: the bench runs our server under
# py-spy (BENCH_PROFILE, see harness.start); `profile_summary.py` reads the gzipped raw profiles.
# Needs the py-spy wheel in .whl (`pip download py-spy==0.4.1 --no-deps -d .whl`).
#   sh bench/h200_profile.sh rerank   # c=1: 20 documents, then 1 document
#   sh bench/h200_profile.sh absa     # c=1, then c=32
#   sh bench/h200_profile.sh absa-c1  # c=1 only
set -eu
. bench/h200_env.sh
cd bench
export PATH="/tmp/site/bin:$PATH"
case "$1" in
rerank)
    for docs in 20 1; do
        BENCH_PROFILE="$OUT/rerank-${docs}docs" python3 rerank.py --systems grpc --concurrency 1 --docs "$docs" \
            --seconds-per-level 10 --work /tmp/bw --out "$OUT/rerank-${docs}docs" 2>&1 | tail -5
    done
    ;;
absa | absa-c1)
    levels=$([ "$1" = absa ] && echo "1 32" || echo 1)
    for c in $levels; do
        BENCH_PROFILE="$OUT/absa-c$c" python3 absa.py --systems grpc --concurrency "$c" \
            --seconds-per-level 10 --work /tmp/bw --out "$OUT/absa-c$c" 2>&1 | tail -5
    done
    ;;
esac
gzip "$OUT"/*/*.pyspy.txt
