#!/bin/sh
# The image-ranking measurements of one H200 staging (`../shared/gpu/README.md` stages vLLM
# first); results and logs land in $OUT.
#   sh bench/h200_image.sh frontends [N]  # HF forward, ours with one and with N (default 4) gRPC
#                                         # front-end processes (decode runs in each), eager (~5 min)
#   sh bench/h200_image.sh check          # parity against the HF reference (~3 min)
set -eu
. bench/h200_env.sh
cd bench
case "$1" in
frontends)
    python3 image_rank.py --eager --seconds-per-level 4 --frontends "1,${2:-4}" --work /tmp/iw --out "$OUT" 2>&1 | tail -25
    ;;
check)
    python3 image_rank_check.py --out "$OUT" 2>&1 | tail -25
    ;;
esac
