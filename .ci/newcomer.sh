# The newcomer's machines for .ci/run (sourced). A new user runs the README's commands on
# a machine with no Docker engine and no bubblewrap, and usually not as root. CI has all of
# them installed (and runs as root), so it takes them away again here:
#
#   as_newcomer CMD...    CMD with a PATH on which the bwrap, docker and runsc programs do not
#                         exist (a directory of links to every other program) and
#                         DOCKER_HOST naming a socket that does not exist: nothing of
#                         either is reachable, as on a fresh machine.
#   as_unprivileged CMD   CMD (a shell command line) as a fresh unprivileged user, in a
#                         copy of the checkout with its own environment (Debian's python3).

NEWCOMER_HIDDEN=" bwrap docker dockerd runsc "

as_newcomer() {
    local bin dir entry name
    bin=$(mktemp -d)
    local IFS=:
    for dir in $PATH; do
        for entry in "$dir"/*; do
            name=${entry##*/}
            case "$NEWCOMER_HIDDEN" in *" $name "*) continue ;; esac
            [ -e "$bin/$name" ] || [ -L "$bin/$name" ] || ln -s "$entry" "$bin/$name"
        done
    done
    unset IFS
    for name in $NEWCOMER_HIDDEN; do
        if PATH="$bin" command -v "$name" >/dev/null; then
            echo "$name is still reachable" >&2
            return 1
        fi
    done
    env -u ASYNCSANDBOX_REQUIRE_DOCKER -u ASYNCSANDBOX_TEST_DOCKER_RESTART -u DOCKER_CONTEXT \
        -u ASYNCSANDBOX_TEST_IMAGE -u ASYNCSANDBOX_TEST_ROOTFS \
        DOCKER_HOST=unix:///nonexistent/docker.sock PATH="$bin" "$@"
}

UNPRIVILEGED_USER=asyncsandbox-ci

as_unprivileged() {
    local home=/home/$UNPRIVILEGED_USER
    id "$UNPRIVILEGED_USER" >/dev/null 2>&1 || as_root useradd --create-home "$UNPRIVILEGED_USER"
    # uv where that user can run it (pip may have put it under root's home, behind a shim).
    local uv_binary
    uv_binary=$(python3 -c 'import uv; print(uv.find_uv_bin())' 2>/dev/null || command -v uv)
    as_root install -m 755 "$uv_binary" /usr/local/bin/uv-ci
    as_root rm -rf "$home/checkout"
    as_root mkdir -p "$home/checkout"
    git ls-files -z --cached --others --exclude-standard | as_root xargs -0 cp --parents -t "$home/checkout"
    as_root chown -R "$UNPRIVILEGED_USER:" "$home/checkout"
    as_root su "$UNPRIVILEGED_USER" -s /bin/bash -c "
        set -e
        cd ~/checkout
        # No --compile-bytecode (35 s of CPU for every installed module): Python writes
        # the bytecode of what the tests import, as they first import it.
        unset PYTHONDONTWRITEBYTECODE
        /usr/local/bin/uv-ci sync --quiet --python /usr/bin/python3
        export PATH=\$HOME/checkout/.venv/bin:\$PATH
        $1"
}
