# Sourced by the image and pod scripts: picks the container engine and its settings.
#
#   ENGINE          docker when a Docker engine answers, else podman (override: ENGINE=...)
#   ENGINE_BUILD    the engine's build command with the flags this project needs
#   CONTAINERS_CONF podman only: scripts/containers.conf unless the user set one
#
# podman builds use the host network (`podman build`'s default network needs a bridge
# that CI sandboxes may not have) and never pull an image that exists locally, so that
# the local stand-in for python:3.11-slim (scripts/base-image.sh) is used.
_engine_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -z ${ENGINE:-} ]]; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        ENGINE=docker
    elif command -v podman >/dev/null 2>&1; then
        ENGINE=podman
    else
        echo "no container engine: install Docker, or podman (apt-get install podman)" >&2
        return 2 2>/dev/null || exit 2
    fi
fi
if [[ $ENGINE == podman ]]; then
    export CONTAINERS_CONF=${CONTAINERS_CONF:-$_engine_dir/containers.conf}
    ENGINE_BUILD=(podman build --pull=never --network host)
else
    ENGINE_BUILD=("$ENGINE" build)
fi
# The tag of every image: the Helm chart's appVersion, which the operator's defaults and
# the BrokerCluster spec's default broker image also use.
IMAGE_TAG=${IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' \
    "$_engine_dir/../helm/undertow/Chart.yaml")}
export ENGINE IMAGE_TAG
