#!/usr/bin/env bash
# Makes a Debian base image locally, for hosts that reach no container registry:
# debootstrap a minimal Debian with Python 3 (the suite's python3: 3.11 on bookworm) and
# import it with `docker import`. Kept once made: a second run with the tag present does
# nothing. The host's extra CA certificates (/usr/local/share/ca-certificates, e.g. an
# egress proxy's) are added to the image's trust store, so pip inside a build trusts what
# the host trusts.
#
#   bash compose/make-base-image.sh [TAG]        # default sluice-base:bookworm
#   docker compose build --build-arg BASE_IMAGE=sluice-base:bookworm   (.env sets it)
set -euo pipefail
TAG=${1:-${BASE_IMAGE:-sluice-base:bookworm}}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image: $TAG is there"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq debootstrap >/dev/null
fi
ROOT=$(mktemp -d /var/tmp/sluice-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
echo "base image: debootstrap $SUITE from $MIRROR (a few minutes, once)"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$SUITE" "$ROOT" "$MIRROR" >/dev/null
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
  chroot "$ROOT" update-ca-certificates >/dev/null 2>&1
fi
# what a slim image leaves out: package lists, caches, documentation, translations
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
  "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
  "$ROOT"/usr/share/locale/* "$ROOT"/var/log/*.log
tar --numeric-owner -C "$ROOT" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  - "$TAG" >/dev/null
echo "base image: $TAG made ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
