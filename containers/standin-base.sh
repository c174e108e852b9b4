#!/usr/bin/env bash
# Make the Dockerfile's base image available to podman: pull it, or, on a machine that
# reaches Debian's archive but no container registry, build a stand-in from Debian's
# packages and tag it with the same name (docs/containers.md, "The base image").
#
# The stand-in is Debian bookworm (what python:3.11-slim-bookworm is built on) with its own
# Python 3.11, a `python` command, and venv support: everything the Dockerfile asks of
# its base. The host's extra CA certificates go into its trust store, and PIP_CERT names
# that store, so a TLS-intercepting proxy that the host trusts is trusted in builds too.
#   usage: containers/standin-base.sh [IMAGE]   (default: the Dockerfile's PYTHON_IMAGE)
set -euo pipefail
image="${1:-docker.io/library/python:3.11-slim-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if podman image exists "$image"; then
    exit 0
fi
if timeout 120 podman pull -q "$image" >/dev/null 2>&1; then
    echo "pulled $image"
    exit 0
fi
echo "cannot pull $image: building a stand-in from Debian's packages ($mirror)"
command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
work="$(mktemp -d -p /var/tmp)"  # /tmp may be a small or nodev tmpfs
trap 'rm -rf --one-file-system "$work"' EXIT
root="$work/root"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log"
    exit 1
}
shopt -s nullglob
extra=(/usr/local/share/ca-certificates/*.crt)
if ((${#extra[@]})); then
    cp "${extra[@]}" "$root/usr/local/share/ca-certificates/"
fi
chroot "$root" update-ca-certificates >/dev/null
ln -sf python3 "$root/usr/bin/python"
# What an image does not need: package lists, caches, documentation.
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
    "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/* "$root"/tmp/*
tar -C "$root" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    - "$image" >/dev/null
echo "built stand-in $image"
