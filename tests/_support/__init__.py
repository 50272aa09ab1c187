"""What the test modules share: waiting for a condition, the host's processes, the process
backend's roots and mechanisms, the Docker engine, a real ``asyncsandbox serve``, the
episodes that recycling must leave nothing of, and the torture suite's targets.

The one place for helpers used by more than one test module (test modules never import
each other: tests/test_suite_hygiene.py checks it): a module of this package per subject,
every name re-exported here, so that a test imports ``from ._support import X``. Fixtures
every test module may use stay in ``conftest.py``; what one family of modules shares (its
fixtures and helpers: ``tests/test_docker_*.py``'s, say) is in the family's own module,
``tests/_<family>_support.py``, and each module of the family binds the fixtures by name.

Waiting: a test never sleeps to let another task or process get somewhere. It waits for
an event, for ``anyio.wait_all_tasks_blocked()``, or for a condition it can observe, polled
under a deadline with :func:`eventually` (blocking callers) or :func:`eventually_async`.
"""

from ._docker import (
    DOCKER_INFO_DEADLINE as DOCKER_INFO_DEADLINE,
    docker_backend as docker_backend,
    docker_pids_squeezed as docker_pids_squeezed,
    docker_problem as docker_problem,
    docker_test_image as docker_test_image,
    require_docker as require_docker,
    require_runsc_runtime as require_runsc_runtime,
)
from ._host import (
    processes_gone as processes_gone,
    processes_with as processes_with,
    running as running,
    runsc_processes as runsc_processes,
    unique_marker as unique_marker,
    wedge_gvisor as wedge_gvisor,
)
from ._process import (
    PROCESS_MECHANISMS as PROCESS_MECHANISMS,
    default_process_mechanism as default_process_mechanism,
    gvisor_unavailable as gvisor_unavailable,
    kill_process_sandbox_processes as kill_process_sandbox_processes,
    mechanism_unavailable as mechanism_unavailable,
    new_process_root as new_process_root,
    process_launch_failure as process_launch_failure,
    process_launcher_broken as process_launcher_broken,
    process_options as process_options,
    sandbox_dirs as sandbox_dirs,
)
from ._recycling import (
    LOOK as LOOK,
    NETWORK_PLANT as NETWORK_PLANT,
    a_recycled_sandbox_has_a_fresh_network as a_recycled_sandbox_has_a_fresh_network,
    a_recycled_sandbox_is_fresh as a_recycled_sandbox_is_fresh,
    episodes_leave_nothing as episodes_leave_nothing,
    look as look,
    plant as plant,
    pool_ready as pool_ready,
)
from ._server import (
    ALICE as ALICE,
    BOB as BOB,
    Server as Server,
    TcpProxy as TcpProxy,
    serving as serving,
    tcp_proxy as tcp_proxy,
)
from ._torture import (
    BOUND as BOUND,
    CANARY_SECRET as CANARY_SECRET,
    FORK_UNTIL_REFUSED as FORK_UNTIL_REFUSED,
    Target as Target,
)
from ._waiting import (
    POLL_INTERVAL as POLL_INTERVAL,
    eventually as eventually,
    eventually_async as eventually_async,
    until_printed as until_printed,
    watch as watch,
)

__all__ = (
    # waiting for a condition
    "POLL_INTERVAL",
    "eventually",
    "eventually_async",
    "until_printed",
    "watch",
    # the host's processes
    "unique_marker",
    "processes_with",
    "running",
    "processes_gone",
    # the process backend
    "new_process_root",
    "sandbox_dirs",
    "PROCESS_MECHANISMS",
    "process_options",
    "default_process_mechanism",
    "mechanism_unavailable",
    "gvisor_unavailable",
    "process_launcher_broken",
    "kill_process_sandbox_processes",
    "process_launch_failure",
    # Docker
    "DOCKER_INFO_DEADLINE",
    "docker_problem",
    "require_docker",
    "require_runsc_runtime",
    "docker_test_image",
    "docker_pids_squeezed",
    "docker_backend",
    # a real server
    "ALICE",
    "BOB",
    "Server",
    "serving",
    "TcpProxy",
    "tcp_proxy",
    # recycling
    "plant",
    "LOOK",
    "look",
    "pool_ready",
    "a_recycled_sandbox_is_fresh",
    "a_recycled_sandbox_has_a_fresh_network",
    "NETWORK_PLANT",
    "episodes_leave_nothing",
    # the torture suite's targets
    "BOUND",
    "CANARY_SECRET",
    "Target",
    "FORK_UNTIL_REFUSED",
)
