#!/bin/sh
# Install libvgpu.so and ld.so.preload into the host directory the device plugin mounts into GPU
# containers (HAMi's vgpu-init.sh): vgpu-init.sh <host dir, e.g. /usr/local/vgpu>.
# The library is copied only when its checksum differs, through a temporary name and a rename, so a
# running container keeps the copy it mapped and never sees a half-written file.
set -eu
DEST="${1:?usage: vgpu-init.sh <directory, e.g. /usr/local/vgpu>}"
# The image carries the glibc-2.17 build of each architecture; the node's own is installed.
LIBDIR="${VGPU_LIB_DIR:-/k8s-vgpu/lib/nvidia}"
SRC="${VGPU_LIB_SRC:-$LIBDIR/$(uname -m)/libvgpu.so}"
[ -n "${VGPU_LIB_SRC:-}" ] || [ -f "$SRC" ] || SRC="$LIBDIR/libvgpu.so"
[ -f "$SRC" ] || { echo "vgpu-init: $SRC is missing from the image" >&2; exit 1; }
mkdir -p "$DEST" "$DEST/containers"
chmod 0777 "$DEST/containers"
if [ -f "$DEST/libvgpu.so" ] && [ "$(sha256sum < "$SRC")" = "$(sha256sum < "$DEST/libvgpu.so")" ]; then
    echo "vgpu-init: $DEST/libvgpu.so is current"
else
    cp "$SRC" "$DEST/.libvgpu.so.new"
    chmod 0755 "$DEST/.libvgpu.so.new"
    mv -f "$DEST/.libvgpu.so.new" "$DEST/libvgpu.so"
    echo "vgpu-init: installed $DEST/libvgpu.so"
fi
PRELOAD="$DEST/libvgpu.so"
if [ "$(cat "$DEST/ld.so.preload" 2>/dev/null || true)" != "$PRELOAD" ]; then
    printf '%s\n' "$PRELOAD" > "$DEST/.ld.so.preload.new"
    mv -f "$DEST/.ld.so.preload.new" "$DEST/ld.so.preload"
    echo "vgpu-init: wrote $DEST/ld.so.preload"
fi
