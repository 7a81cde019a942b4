#!/usr/bin/env bash
# Builds the three images, tagged with the Helm chart's appVersion (what the operator and
# the BrokerCluster spec use by default), with Docker where a Docker engine answers, else
# podman; prints each image's size.
#
#   scripts/images.sh [minibroker|operator|analysis ...]      (default: all three)
#
# Every build context is the repository root (see .dockerignore). Where python:3.11-slim
# cannot be pulled, scripts/base-image.sh first makes a local stand-in from Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/container-engine.sh

declare -A DOCKERFILE=([minibroker]=broker-image/Dockerfile [operator]=operator/Dockerfile
                       [analysis]=analysis/Dockerfile)
images=("$@")
[[ ${#images[@]} -gt 0 ]] || images=(minibroker operator analysis)
for image in "${images[@]}"; do
    [[ -n ${DOCKERFILE[$image]:-} ]] || { echo "images: unknown image $image" >&2; exit 2; }
done

scripts/base-image.sh
for image in "${images[@]}"; do
    printf '==> building undertow/%s:%s (%s)\n' "$image" "$IMAGE_TAG" "$ENGINE"
    "${ENGINE_BUILD[@]}" -q -f "${DOCKERFILE[$image]}" -t "undertow/$image:$IMAGE_TAG" . >/dev/null
done
for image in "${images[@]}"; do
    "$ENGINE" image inspect --format "undertow/$image:$IMAGE_TAG {{.Size}}" \
        "undertow/$image:$IMAGE_TAG" \
        | awk '{printf "%-32s %6.0f MB\n", $1, $2 / 1e6}'
done
