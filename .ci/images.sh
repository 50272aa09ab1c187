# Test images for .ci/run (sourced). No container registry is reachable, so the image is
# built from Debian packages: a minimal Debian root filesystem with python3 (and matplotlib,
# for the code interpreter's figures), imported into Docker. The same directory serves the
# process backend's root-filesystem tests.
#
# The tag (and the directory) name what is in it: change the packages, bump the number,
# so that every machine builds the new image instead of using the old one.
# bookworm-2: python3-matplotlib added.

ROOTFS="$ASYNCSANDBOX_CI_STATE/rootfs-bookworm-2"
TEST_IMAGE="asyncsandbox-test:bookworm-2"
PACKAGES="python3,python3-matplotlib"

build_test_images() {
    if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
        echo "debootstrap: minimal Debian bookworm with $PACKAGES (a minute or two)"
        as_root rm -rf "$ROOTFS.partial"
        as_root debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOTFS.partial" \
            >"$ASYNCSANDBOX_CI_STATE/debootstrap.log" 2>&1 || {
            tail -n 30 "$ASYNCSANDBOX_CI_STATE/debootstrap.log" >&2
            return 1
        }
        as_root rm -rf "$ROOTFS"
        as_root mv "$ROOTFS.partial" "$ROOTFS"
    fi
    if ! timeout 30 docker image inspect "$TEST_IMAGE" >/dev/null 2>&1; then
        echo "docker import $TEST_IMAGE"
        as_root tar -C "$ROOTFS" -c . | timeout 300 docker import - "$TEST_IMAGE" >/dev/null
    fi
    echo "root filesystem: $ROOTFS; image: $TEST_IMAGE"
}
