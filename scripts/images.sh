#!/usr/bin/env bash
# Builds the three images, tagged with the Helm chart's appVersion (what the operator and
# the BrokerCluster spec use by default), with Docker where a Docker engine answers, else
# podman; then pushes them to a registry and/or loads them into a kind cluster when asked;
# prints each image's size.
#
#   scripts/images.sh [--dry-run] [minibroker|operator|analysis ...]   (default: all three)
#
# Environment:
#   IMAGE_REGISTRY  also tag each image $IMAGE_REGISTRY/undertow/<name>:<tag> and push it
#                   there (e.g. registry.example.com/team; log in first). Install the chart
#                   with --set images.registry=$IMAGE_REGISTRY and give BrokerClusters
#                   spec.image: $IMAGE_REGISTRY/undertow/minibroker:<tag>.
#   KIND_CLUSTER    load each image into this kind cluster (kind must be installed): with
#                   Docker `kind load docker-image`; with podman `podman save` and
#                   `kind load image-archive`, under the name the pods ask for
#                   (docker.io/undertow/<name>:<tag>, not podman's localhost/undertow/...).
#   IMAGE_TAG       the tag (default: the chart's appVersion)
#   ENGINE          docker|podman (default: docker when a Docker engine answers, else podman)
#   IMAGES_DRY_RUN=1, or --dry-run: print the commands instead of running them.
# Without IMAGE_REGISTRY and KIND_CLUSTER the images stay local: undertow/<name>:<tag>
# (localhost/undertow/<name>:<tag> under podman).
#
# Every build context is the repository root (see .dockerignore). Where python:3.11-slim
# cannot be pulled, scripts/base-image.sh first makes a local stand-in from Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=${IMAGES_DRY_RUN:-0}
images=()
for arg in "$@"; do
    case $arg in
        --dry-run) dry_run=1 ;;
        -*) echo "images: unknown option $arg" >&2; exit 2 ;;
        *) images+=("$arg") ;;
    esac
done

. scripts/container-engine.sh

declare -A DOCKERFILE=([minibroker]=broker-image/Dockerfile [operator]=operator/Dockerfile
                       [analysis]=analysis/Dockerfile)
[[ ${#images[@]} -gt 0 ]] || images=(minibroker operator analysis)
for image in "${images[@]}"; do
    [[ -n ${DOCKERFILE[$image]:-} ]] || { echo "images: unknown image $image" >&2; exit 2; }
done

registry=${IMAGE_REGISTRY:-}
registry=${registry%/}
if [[ $registry == *://* || $registry =~ [[:space:]] ]]; then
    echo "images: IMAGE_REGISTRY=$IMAGE_REGISTRY: expected a registry host and path such as" \
         "registry.example.com/team (no scheme, no spaces)" >&2
    exit 2
fi
kind_cluster=${KIND_CLUSTER:-}
if [[ -n $kind_cluster ]] && ! command -v kind >/dev/null 2>&1; then
    echo "images: KIND_CLUSTER=$kind_cluster but kind is not installed" \
         "(https://kind.sigs.k8s.io/docs/user/quick-start/#installation)" >&2
    exit 2
fi

# run [--quiet] COMMAND...: runs it (--quiet: without its standard output), or prints it.
run() {
    local quiet=0
    if [[ $1 == --quiet ]]; then quiet=1; shift; fi
    if [[ $dry_run == 1 ]]; then
        printf '+'; printf ' %q' "$@"; printf '\n'
    elif [[ $quiet == 1 ]]; then
        "$@" >/dev/null
    else
        "$@"
    fi
}

run scripts/base-image.sh
for image in "${images[@]}"; do
    printf '==> building undertow/%s:%s (%s)\n' "$image" "$IMAGE_TAG" "$ENGINE"
    run --quiet "${ENGINE_BUILD[@]}" -q -f "${DOCKERFILE[$image]}" \
        -t "undertow/$image:$IMAGE_TAG" .
done

for image in "${images[@]}"; do
    local_ref=undertow/$image:$IMAGE_TAG
    ref=$local_ref
    if [[ -n $registry ]]; then
        ref=$registry/undertow/$image:$IMAGE_TAG
        printf '==> pushing %s\n' "$ref"
        run "$ENGINE" tag "$local_ref" "$ref"
        run "$ENGINE" push "$ref"
    fi
    if [[ -n $kind_cluster ]]; then
        printf '==> loading %s into kind cluster %s\n' "$ref" "$kind_cluster"
        if [[ $ENGINE == docker ]]; then
            run kind load docker-image "$ref" --name "$kind_cluster"
        else
            # kind's `load docker-image` asks docker. podman names a local image
            # localhost/undertow/...; the pods ask for undertow/... = docker.io/undertow/...,
            # so that is the name the archive carries.
            [[ -n $registry ]] || { ref=docker.io/$local_ref; run podman tag "$local_ref" "$ref"; }
            archive=${TMPDIR:-/tmp}/undertow-$image-$IMAGE_TAG.tar
            run podman save -q --format docker-archive -o "$archive" "$ref"
            run kind load image-archive "$archive" --name "$kind_cluster"
            run rm -f "$archive"
        fi
    fi
done

[[ $dry_run == 1 ]] && exit 0
for image in "${images[@]}"; do
    "$ENGINE" image inspect --format "undertow/$image:$IMAGE_TAG {{.Size}}" \
        "undertow/$image:$IMAGE_TAG" \
        | awk '{printf "%-32s %6.0f MB\n", $1, $2 / 1e6}'
done
