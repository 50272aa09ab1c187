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
