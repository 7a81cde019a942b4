#!/usr/bin/env bash
# Makes sure the base images the Dockerfiles start FROM exist: python:3.11-slim and
# python:3.11-slim-bookworm. Pulled when a registry answers; otherwise (machines that reach
# package registries but no container registry) built locally from Debian 12's packages
# with mmdebstrap — Debian 12's python3 is 3.11 — and imported under the same names, so
# the Dockerfiles build unchanged.
#
# When the host trusts an extra certificate authority to reach the package registries
# (PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE, or pip's `cert` setting, names a bundle),
# that bundle goes into the local base too, or `pip install` in the builds fails with
# CERTIFICATE_VERIFY_FAILED.
#
# Environment: ENGINE (docker|podman), DEBIAN_MIRROR (default: the host's apt source),
# FORCE_LOCAL_BASE=1 (build locally even if a pull would work).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/container-engine.sh

BASE=python:3.11-slim
ALIASES=(python:3.11-slim-bookworm)

log() { printf '==> %s\n' "$*" >&2; }

have_image() {
    if [[ $ENGINE == podman ]]; then
        podman image exists "$1"
    else
        docker image inspect "$1" >/dev/null 2>&1
    fi
}

tag_aliases() {
    for alias in "${ALIASES[@]}"; do
        have_image "$alias" || "$ENGINE" tag "$1" "$alias"
    done
}

if have_image "$BASE"; then
    tag_aliases "$BASE"
    exit 0
fi
if [[ ${FORCE_LOCAL_BASE:-0} != 1 ]]; then
    log "pulling $BASE"
    if timeout 120 "$ENGINE" pull "docker.io/library/$BASE" >/dev/null 2>&1; then
        "$ENGINE" tag "docker.io/library/$BASE" "$BASE"
        tag_aliases "$BASE"
        exit 0
    fi
    log "no registry answers; building $BASE from Debian packages instead"
fi

debian_mirror() {
    # The first plain Debian archive URI in the host's apt sources (deb822 or one-line).
    local uri
    uri=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | tr ' ' '\n' | grep -v -- '-security' | head -n 1 || true)
    if [[ -z $uri ]]; then
        uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            | awk '{print $2}' | grep -v -- '-security' | head -n 1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

ca_bundle() {
    local candidate
    for candidate in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" \
        "$(pip config get global.cert 2>/dev/null || true)"; do
        if [[ -n $candidate && -f $candidate ]]; then
            echo "$candidate"
            return
        fi
    done
}

if ! command -v mmdebstrap >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y -qq mmdebstrap >/dev/null
    else
        echo "base-image: $BASE cannot be pulled and mmdebstrap is missing" \
             "(apt-get install mmdebstrap)" >&2
        exit 2
    fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
log "mmdebstrap bookworm from the host's Debian mirror"
# As Debian's official images do: no documentation, manual pages or translations, and apt
# drops downloaded packages after each install (its "docker-clean" setting); /usr is
# merged by a hook instead of the usrmerge package, which would pull in perl.
mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --customize-hook='printf "%s\n" "DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true\"; };" "APT::Update::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true\"; };" "Binary::apt::APT::Keep-Downloaded-Packages \"false\";" > "$1/etc/apt/apt.conf.d/docker-clean"' \
    bookworm "$work/base.tar" "$mirror"
"$ENGINE" import \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' "$work/base.tar" "$BASE-debian" >/dev/null 2>&1

bundle=$(ca_bundle)
if [[ -n $bundle ]]; then
    log "adding the host's CA bundle ($bundle)"
    cp "$bundle" "$work/ca-certificates.crt"
    cat > "$work/Dockerfile" <<DOCKERFILE
FROM $BASE-debian
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \\
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
DOCKERFILE
    "${ENGINE_BUILD[@]}" -q -t "$BASE" "$work" >/dev/null
    "$ENGINE" rmi "$BASE-debian" >/dev/null
else
    "$ENGINE" tag "$BASE-debian" "$BASE"
fi
tag_aliases "$BASE"
log "$BASE is ready ($ENGINE)"
