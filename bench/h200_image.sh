#!/bin/sh
# The image-ranking measurements of one H200 staging (`../shared/gpu/README.md` stages vLLM
# first); results and logs land in $OUT.
#   sh bench/h200_image.sh frontends [N]  # HF forward, ours with one and with N (default 4) gRPC
#                                         # front-end processes (decode runs in each), eager (~5 min)
#   sh bench/h200_image.sh check          # parity against the HF reference (~3 min)
#   sh bench/h200_image.sh decode         # nvJPEG pixels against Pillow's (the `gpu` case of
#                                         # tests/unit/test_device_pixels.py; needs the pytest,
#                                         # pluggy, iniconfig and pygments wheels in .whl), both
#                                         # paths' preparation alone (image_pixels.py), then ours
#                                         # with one and four front-ends, each decoding with Pillow
#                                         # and on the GPU (decode_device cuda), eager (~8 min)
#   sh bench/h200_image.sh ab [N]         # this tree against the base build (.whl-base, or the
#                                         # directory WHL_BASE names), both up at once, N (default
#                                         # 4) front-ends each decoding on the GPU, levels
#                                         # interleaved for AB_ROUNDS (default 3) rounds, inline
#                                         # then by URL, eager; the A/B tables (~7 min)
set -eu
. bench/h200_env.sh
cd bench
case "$1" in
frontends)
    shown "^Image ranking," "$OUT/frontends.log" python3 image_rank.py --eager --seconds-per-level 4 --frontends "1,${2:-4}" \
        --work /tmp/iw --out "$OUT"
    ;;
check)
    shown "^{" "$OUT/check.log" python3 image_rank_check.py --out "$OUT"
    ;;
decode)
    (cd .. && python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_device_pixels.py 2>&1 | tail -5)
    python3 image_pixels.py | tee "$OUT/image-pixels.md"
    shown "^Image ranking," "$OUT/decode.log" python3 image_rank.py --eager --seconds-per-level 4 --frontends 1,4 \
        --decode-devices cpu,cuda --systems grpc --work /tmp/iw --out "$OUT"
    ;;
ab)
    install_base
    shown "^Image ranking," "$OUT/ab.log" python3 image_rank.py --eager --seconds-per-level 4 --frontends "${2:-4}" \
        --decode-devices cuda --systems grpc,grpc-base --base-site /tmp/site-base --ab-rounds "${AB_ROUNDS:-3}" \
        --work /tmp/iw-ab --out "$OUT/ab"
    ;;
esac
