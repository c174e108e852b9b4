#!/usr/bin/env bash
# Make this machine able to run docker-compose.yml without a Docker engine: podman and
# runc from Debian's packages (podman-compose comes with the dev extra), the engine
# settings podman needs here, the Dockerfile's base image (containers/standin-base.sh),
# and the compose file's images, built from this checkout.
# Run as root; each step is skipped when already done. (docs/containers.md)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for tool in podman runc; do
    command -v "$tool" >/dev/null || need+=("$tool")
done
# netavark and its name server (containers find each other by service name), and the
# iptables netavark publishes ports with (no package of podman's depends on it).
[ -x /usr/lib/podman/netavark ] || need+=(netavark)
[ -x /usr/lib/podman/aardvark-dns ] || need+=(aardvark-dns)
command -v iptables >/dev/null || need+=(iptables)
if ((${#need[@]})); then
    echo "installing ${need[*]} from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc netavark aardvark-dns \
        iptables slirp4netns uidmap fuse-overlayfs >/dev/null
fi

# The open-file and process limits a broker wants (the default nofile is 1024), runc as
# the runtime, and events to a file (there is no journald in these machines).
# A drop-in file, so an existing containers.conf is left as it is.
mkdir -p /etc/containers/containers.conf.d
cat >/etc/containers/containers.conf.d/rillet.conf <<'CONF'
# Written by rillet's containers/podman-setup.sh.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
events_logger = "file"
CONF

image="$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)"
bash containers/standin-base.sh "$image"

# Every image of the compose file, one after another (podman-compose would build the node
# image once per service naming it, all at once); layers are cached, so a build after no
# change takes seconds.
podman build -q -t rillet:latest . >/dev/null
podman build -q --target spark -t rillet-spark:latest . >/dev/null
podman build -q --target prometheus -t rillet-prometheus:latest . >/dev/null
echo "built rillet:latest, rillet-spark:latest, rillet-prometheus:latest"
