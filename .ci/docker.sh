# Docker engine helpers for .ci/run (sourced). The engine on these machines is Debian's
# Docker 20.10, which can wedge under container churn (moby/moby#46661): calls such as
# `info` hang while `/_ping` still answers. Every probe here has a deadline, and the
# watchdog restarts a wedged daemon and says so, instead of letting CI hang.

DOCKERD_LOG="$ASYNCSANDBOX_CI_STATE/dockerd.log"

docker_answers() { timeout "${1:-10}" docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

docker_launch() {
    as_root bash -c "nohup dockerd --bridge=none --iptables=false --ip6tables=false >>'$DOCKERD_LOG' 2>&1 &"
    for _ in $(seq 1 60); do
        docker_answers 5 && return 0
        sleep 1
    done
    echo "the Docker daemon did not answer within 60s; its log:" >&2
    tail -n 40 "$DOCKERD_LOG" >&2 || true
    return 1
}

docker_start() {
    if docker_answers 10; then
        echo "Docker engine already running: $(timeout 10 docker version --format '{{.Server.Version}}')"
        return 0
    fi
    docker_launch
    echo "Docker engine started: $(timeout 10 docker version --format '{{.Server.Version}}')"
}

# gVisor as a Docker runtime (DockerBackend(runtime="runsc"), tests/test_docker_gvisor.py),
# configured as Docker documents runtimes: an entry under "runtimes" in daemon.json (kept
# with whatever else the file holds), read by a starting daemon and by a running one on
# SIGHUP (no restart: others may be using the engine). runsc's own network stack is not
# used (sandboxes have none): without --network=none it refuses Docker's "none" network.
DOCKER_DAEMON_JSON=/etc/docker/daemon.json

docker_configure_gvisor() {
    as_root python3 - "$DOCKER_DAEMON_JSON" <<'PY'
import json, os, sys
path = sys.argv[1]
config = {}
if os.path.exists(path):
    with open(path) as f:
        config = json.load(f)
config.setdefault("runtimes", {})["runsc"] = {
    "path": "/usr/bin/runsc",
    "runtimeArgs": ["--network=none"],
}
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
os.replace(path + ".tmp", path)
PY
}

docker_has_gvisor() { timeout 10 docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

docker_reload_for_gvisor() {
    docker_has_gvisor && return 0
    as_root kill -HUP "$(pidof dockerd)"
    for _ in $(seq 1 30); do
        docker_has_gvisor && return 0
        sleep 1
    done
    echo "the Docker daemon did not take the runsc runtime from $DOCKER_DAEMON_JSON" >&2
    return 1
}

docker_restart() {
    as_root pkill -9 -x dockerd || true
    as_root pkill -9 -x containerd || true
    sleep 2
    docker_launch
}

# Runs in the background during the tests.
docker_watchdog() {
    local failures=0
    while sleep 20; do
        if docker_answers 20; then
            failures=0
            continue
        fi
        failures=$((failures + 1))
        if [ $failures -ge 2 ]; then
            echo "CI WATCHDOG: the Docker daemon is wedged ('docker info' did not answer twice within 20s; moby/moby#46661); restarting it" >&2
            docker_restart || echo "CI WATCHDOG: restart failed" >&2
            failures=0
        fi
    done
}

docker_report() {
    echo "--- docker state after failure" >&2
    docker_answers 10 && timeout 20 docker ps -a --format '{{.ID}} {{.Status}} {{.Labels}}' >&2 || echo "docker does not answer" >&2
    tail -n 30 "$DOCKERD_LOG" >&2 || true
}
