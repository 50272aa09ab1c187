"""The seed SDK's value types for :mod:`asyncsandbox.compat.cwsandbox`: its exceptions (and
the translation of asyncsandbox's into them), statuses, ``SandboxDefaults``,
``ProcessResult``, and the metric names of its two spellings."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
import enum
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, final

from .. import _errors as native
from .._config import Resources
from .._models import ExecResult

# -- exceptions ---------------------------------------------------------------------------


class CWSandboxError(Exception):
    """Base class of the SDK's errors. Like the SDK's, each carries ``reason``,
    ``metadata`` and ``retry_delay``; the asyncsandbox error it translates, if any, is its
    ``__cause__``."""

    def __init__(
        self,
        message: str = "",
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        retry_delay: timedelta | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.retry_delay = retry_delay


class CWSandboxAuthenticationError(CWSandboxError):
    """Authentication failed (never raised locally: there is no authentication)."""


class CWSandboxValidationError(CWSandboxError, ValueError):
    """An argument is invalid; nothing was done."""

    field_violations: ClassVar[tuple[str, ...]] = ()


class SandboxError(CWSandboxError):
    """Base class of the errors of sandbox operations."""


class SandboxValidationError(SandboxError, CWSandboxValidationError):
    """An argument of a sandbox operation is invalid."""


class SandboxNotRunningError(SandboxError):
    """The sandbox is not running (it was stopped, or its session closed)."""


class SandboxUnavailableError(SandboxNotRunningError):
    """The backend cannot be reached or refused service (retryable)."""


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A command ran past its ``timeout_seconds`` (it was killed), or a wait ran out.

    For a command, ``exec_result`` holds what it printed until then.
    """

    def __init__(self, message: str = "", *, exec_result: ProcessResult | None = None) -> None:
        super().__init__(message)
        self.exec_result = exec_result


class SandboxRequestTimeoutError(SandboxTimeoutError):
    """An infrastructure call did not finish within its deadline."""


class SandboxCommandTimeoutError(SandboxTimeoutError):
    """The command's own deadline passed (the SDK raises SandboxTimeoutError for exec)."""


class SandboxTerminatedError(SandboxError):
    """The sandbox was stopped."""


class SandboxFailedError(SandboxError):
    """The sandbox failed (it died, was killed, or its lifetime ended)."""

    def __init__(
        self, message: str = "", *, sandbox_id: str | None = None, status_reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id
        self.status_reason = status_reason


class SandboxNotFoundError(SandboxError, LookupError):
    """No sandbox with this id."""

    def __init__(self, message: str = "", *, sandbox_id: str | None = None) -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id


class SandboxExecutionError(SandboxError):
    """``exec(..., check=True)`` and the command exited non-zero (``exec_result``)."""

    def __init__(
        self,
        message: str = "",
        *,
        exec_result: ProcessResult | None = None,
        exception_type: str | None = None,
        exception_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.exec_result = exec_result
        self.exception_type = exception_type
        self.exception_message = exception_message


class SandboxFileError(SandboxError):
    """A file operation failed: ``filepath`` and ``reason`` (``CWSANDBOX_FILE_NOT_FOUND``,
    ``_IS_DIRECTORY``, ``_PERMISSION_DENIED``, ``_TOO_LARGE`` or ``_IO_FAILED``)."""

    def __init__(self, message: str = "", *, filepath: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.filepath = filepath


class SandboxResourceExhaustedError(SandboxError):
    """No capacity: every sandbox slot of the session stayed taken for the whole wait."""


class UnsupportedFeatureError(CWSandboxError, NotImplementedError):
    """The SDK has this, asyncsandbox.compat does not (the message says what to do)."""


class CloudOnlyFeatureError(UnsupportedFeatureError):
    """The feature exists only on the CoreWeave cloud service (placement, GPUs, volumes,
    snapshots, services, secrets...): there is no local equivalent."""


def cloud_only(feature: str, detail: str = "") -> CloudOnlyFeatureError:
    return CloudOnlyFeatureError(
        f"{feature} is a feature of the CoreWeave cloud service; asyncsandbox runs sandboxes "
        f"locally and has no equivalent{f' ({detail})' if detail else ''}"
    )


_FILE_REASONS = {
    native.FileErrorReason.NOT_FOUND: "CWSANDBOX_FILE_NOT_FOUND",
    native.FileErrorReason.IS_A_DIRECTORY: "CWSANDBOX_FILE_IS_DIRECTORY",
    native.FileErrorReason.PERMISSION: "CWSANDBOX_FILE_PERMISSION_DENIED",
    native.FileErrorReason.TOO_LARGE: "CWSANDBOX_FILE_TOO_LARGE",
}


def translate(exc: BaseException, *, timeout: float | None = None) -> BaseException:
    """The SDK's exception for an asyncsandbox one (others are returned unchanged). Raise
    it ``from exc``: the original stays reachable as ``__cause__``."""
    if isinstance(exc, native.ExecTimeout):
        result = process_result(exc.result)
        limit = f" after {timeout:g}s" if timeout is not None else ""
        return SandboxTimeoutError(
            f"Command {' '.join(exc.result.argv)} timed out{limit}", exec_result=result
        )
    if isinstance(exc, native.ExecFailed):
        return SandboxExecutionError(
            f"Command {' '.join(exc.result.argv)} exited with {exc.result.returncode}",
            exec_result=process_result(exc.result),
        )
    if isinstance(exc, native.SandboxFileError):
        return SandboxFileError(
            str(exc),
            filepath=exc.path,
            reason=_FILE_REASONS.get(exc.reason, "CWSANDBOX_FILE_IO_FAILED"),
        )
    if isinstance(exc, native.CapacityTimeout):
        return SandboxResourceExhaustedError(
            f"{exc}: every sandbox slot of the session stayed in use (are sandboxes stopped "
            "when their episode ends? Session.sandbox() objects that are dropped are stopped "
            "when collected)"
        )
    if isinstance(exc, native.BackendTimeout):
        return SandboxRequestTimeoutError(str(exc))
    if isinstance(exc, native.SandboxDied):
        return SandboxFailedError(str(exc), sandbox_id=exc.sandbox_id, status_reason=exc.reason)
    if isinstance(exc, native.BackendUnavailable | native.LaunchError):
        return SandboxUnavailableError(str(exc))
    if isinstance(exc, native.SandboxClosed):
        return SandboxNotRunningError(str(exc))
    if isinstance(exc, native.SandboxNotFound):
        return SandboxNotFoundError(str(exc), sandbox_id=exc.sandbox_id)
    if isinstance(exc, native.OperationCancelled):
        return concurrent.futures.CancelledError(str(exc))
    if isinstance(exc, native.InvalidArgument):
        return SandboxValidationError(str(exc))
    if isinstance(exc, native.BackendNotFound):
        return CWSandboxValidationError(str(exc))
    if isinstance(exc, native.SandboxError):
        return SandboxError(str(exc))
    return exc


# -- statuses -----------------------------------------------------------------------------


class SandboxStatus(enum.StrEnum):
    """A sandbox's lifecycle state, with the SDK's values (plain strings compare equal)."""

    RUNNING = "running"
    CREATING = "creating"
    PREPARING = "preparing"
    PENDING = "pending"
    PAUSED = "paused"
    TERMINATING = "terminating"
    COMPLETED = "completed"
    FAILED = "failed"
    TERMINATED = "terminated"
    UNSPECIFIED = "unspecified"

    @classmethod
    def from_native(cls, status: str) -> SandboxStatus:
        """The status of a sandbox as asyncsandbox reports it (``SandboxInfo.status``)."""
        return _FROM_NATIVE.get(str(status), cls.UNSPECIFIED)

    def to_native(self) -> set[str]:
        """The asyncsandbox statuses (``SandboxInfo.status`` values) this one covers."""
        return {n for n, s in _FROM_NATIVE.items() if s is self}


_FROM_NATIVE = {
    "creating": SandboxStatus.PENDING,
    "running": SandboxStatus.RUNNING,
    "removing": SandboxStatus.TERMINATING,
    "stopped": SandboxStatus.TERMINATED,
    "dead": SandboxStatus.FAILED,
}
ACTIVE = frozenset({SandboxStatus.PENDING, SandboxStatus.RUNNING, SandboxStatus.TERMINATING})
"""What ``list()`` shows without ``show_terminated`` (the SDK's active sandboxes)."""

# -- results --------------------------------------------------------------------------------


@final
@dataclass(frozen=True)
class ProcessResult:
    """A finished command: ``stdout`` and ``stderr`` as str (UTF-8, invalid bytes replaced),
    the raw bytes, ``returncode`` and ``command``. (The SDK's is mutable; this one is
    frozen.)"""

    stdout: str
    stderr: str
    returncode: int
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    command: list[str] = dataclasses.field(default_factory=list)


def process_result(result: ExecResult) -> ProcessResult:
    return ProcessResult(
        stdout=result.stdout_text,
        stderr=result.stderr_text,
        returncode=result.returncode,
        stdout_bytes=result.stdout,
        stderr_bytes=result.stderr,
        command=list(result.argv),
    )


# -- SandboxDefaults --------------------------------------------------------------------------

KEEP_ALIVE_ARGS = ("-c", 'trap "exit 0" TERM INT; sleep infinity & wait')
DEFAULT_BASE_URL = "https://api.cwsandbox.com"

# Options of the cloud service, accepted at their default (so configs carrying them load)
# and refused otherwise: name -> what it is.
CLOUD_OPTIONS = {
    "base_url": "the address of the CoreWeave control plane",
    "auth": "authentication to the CoreWeave API",
    "runner_ids": "placement on CoreWeave runners",
    "placement_mode": "placement modes (serverless, CKS)",
    "placement_spillover": "placement spillover",
    "services": "exposed services and endpoints",
    "volumes": "volumes",
    "runtime_class": "runtime classes (e.g. gVisor)",
    "security_context": "Kubernetes security contexts",
    "object_storage_access": "object storage credentials",
    "file_system_snapshot": "file-system snapshots",
    "containers": "multi-container sandboxes",
    "secrets": "secrets from secret stores",
    "annotations": "Kubernetes pod annotations",
    "data_plane_mode": "the choice of data plane (gateway or direct)",
    "template_id": "sandbox templates",
    "image_pull_credentials": "private registry credentials",
}
# Tuning knobs of the cloud client's retries and polling: no meaning locally, any value is
# accepted (they change no outcome).
CLIENT_TUNING = (
    "create_retry_budget_seconds",
    "poll_retry_budget_seconds",
    "poll_rpc_timeout_seconds",
)
REMOVED_1X = ("profile_ids", "profile_names", "s3_mount", "ports", "max_timeout_seconds")
NATIVE_NAMES = {
    "image": "container_image",
    "env": "environment_variables",
    "workdir": "working_dir",
    "max_lifetime": "max_lifetime_seconds",
    "timeout": "timeout_seconds",
}


def unknown_argument(where: str, name: str, known: Iterable[str]) -> TypeError:
    """The TypeError for an unknown keyword: names the SDK spelling of asyncsandbox's own
    names, else the closest known one."""
    if name in REMOVED_1X:
        return TypeError(f"{where}: {name!r} was removed from the SDK in 2.0")
    hint = ""
    if name in NATIVE_NAMES:
        hint = f"; this API calls it {NATIVE_NAMES[name]!r} ({name!r} is asyncsandbox's own name)"
    else:
        close = difflib.get_close_matches(name, list(known), n=1)
        if close:
            hint = f"; did you mean {close[0]!r}?"
    return TypeError(f"{where} got an unexpected keyword argument {name!r}{hint}")


@final
@dataclass(frozen=True, init=False)
class SandboxDefaults:
    """Settings shared by the sandboxes of a Session (the SDK's fields and defaults).

    What runs locally: ``container_image`` (on Docker; the process backend runs the host's
    system), ``tags``, ``environment_variables``, ``working_dir``, ``resources`` (cpu and
    memory), ``max_lifetime_seconds``, ``request_timeout_seconds`` (the default exec
    timeout and the longest wait for a sandbox slot), ``network`` (``deny_egress``), and the
    default keep-alive ``command``/``args``. The cloud's options (``base_url``, placement,
    volumes, services, secrets...) are accepted at their defaults and raise
    :class:`CloudOnlyFeatureError` otherwise. Unknown names raise ``TypeError``.
    """

    container_image: str = "python:3.11"
    command: str = "/bin/sh"
    args: tuple[str, ...] = KEEP_ALIVE_ARGS
    base_url: str = DEFAULT_BASE_URL
    auth: Any = None
    request_timeout_seconds: float = 300.0
    create_retry_budget_seconds: float = 0.0
    poll_retry_budget_seconds: float = 30.0
    poll_rpc_timeout_seconds: float = 15.0
    max_lifetime_seconds: float | None = None
    temp_dir: str = "/tmp"
    tags: tuple[str, ...] = ()
    runner_ids: Any = None
    placement_mode: Any = None
    placement_spillover: Any = None
    resources: Any = None
    network: Any = None
    services: Any = None
    volumes: Any = None
    runtime_class: Any = None
    security_context: Any = None
    working_dir: str | None = None
    object_storage_access: Any = None
    file_system_snapshot: Any = None
    containers: Any = None
    secrets: Any = None
    environment_variables: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    data_plane_mode: Any = None

    def __init__(self, **kwargs: Any) -> None:
        fields = {f.name: f for f in dataclasses.fields(self)}
        for name in kwargs:
            if name not in fields:
                raise unknown_argument("SandboxDefaults()", name, fields)
        for name, f in fields.items():
            if name in kwargs:
                value = kwargs[name]
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, name, value)
        self._validate()

    def _validate(self) -> None:
        image: object = self.container_image  # typed, but callers pass anything
        if not isinstance(image, str) or not image:
            raise CWSandboxValidationError(
                f"container_image must be a non-empty str, got {image!r}"
            )
        object.__setattr__(self, "tags", normalize_tags(self.tags))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "environment_variables", dict(self.environment_variables))
        object.__setattr__(self, "annotations", dict(self.annotations))
        for name in ("request_timeout_seconds", *CLIENT_TUNING):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise CWSandboxValidationError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise CWSandboxValidationError(f"{name} must be finite and >= 0, got {value!r}")
        if self.request_timeout_seconds == 0:
            raise CWSandboxValidationError("request_timeout_seconds must be > 0")
        lifetime: object = self.max_lifetime_seconds
        if lifetime is not None and (
            isinstance(lifetime, bool)
            or not isinstance(lifetime, int | float)
            or not math.isfinite(lifetime)
            or lifetime <= 0
        ):
            raise CWSandboxValidationError(
                f"max_lifetime_seconds must be a number > 0 or None, got {lifetime!r}"
            )

    def merge_tags(self, additional: Iterable[str] | None) -> tuple[str, ...]:
        """The default tags followed by ``additional`` (duplicates kept, as in the SDK)."""
        return self.tags + (normalize_tags(additional) if additional is not None else ())

    def merge_environment_variables(self, additional: Mapping[str, str] | None) -> dict[str, str]:
        """The default environment with ``additional`` on top."""
        return {**self.environment_variables, **(additional or {})}

    def merge_annotations(self, additional: Mapping[str, str] | None) -> dict[str, str]:
        """The default annotations with ``additional`` on top."""
        return {**self.annotations, **(additional or {})}

    def with_overrides(self, **kwargs: Any) -> SandboxDefaults:
        """A copy with ``kwargs`` replaced (checked like a new instance)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in kwargs:
            if name not in values:
                raise unknown_argument("SandboxDefaults.with_overrides()", name, values)
        return SandboxDefaults(**{**values, **kwargs})

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> SandboxDefaults:
        """Defaults from a mapping (an OmegaConf ``DictConfig`` works too). Unknown keys are
        ignored, as the SDK does; the 1.x profile keys raise."""
        items = dict(mapping.items())
        for name in ("profile_ids", "profile_names"):
            if name in items:
                raise unknown_argument("SandboxDefaults.from_dict()", name, ())
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in items.items() if k in known})

    def cloud_options(self) -> list[str]:
        """The cloud-only options set to something other than their default."""
        out = []
        for name in CLOUD_OPTIONS:
            value = getattr(self, name, None)  # some are per-sandbox arguments only
            default = DEFAULT_BASE_URL if name == "base_url" else None
            if name == "annotations":
                if value:
                    out.append(name)
            elif value != default:
                out.append(name)
        return out


def normalize_tags(value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes):
        raise CWSandboxValidationError(
            f"tags must be a sequence of strings, not a single string: {value!r}"
        )
    if not isinstance(value, Iterable):
        raise CWSandboxValidationError(f"tags must be a sequence of strings, got {value!r}")
    tags = tuple(value)
    for tag in tags:
        if not isinstance(tag, str) or not tag:
            raise CWSandboxValidationError(f"each tag must be a non-empty str, got {tag!r}")
    return tags


# -- resources ------------------------------------------------------------------------------

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")
_MEMORY_UNITS = {
    "": 1,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
}


def _quantity(name: str, value: object, units: Mapping[str, float]) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = _QUANTITY.match(str(value).strip())
        if match is None or match.group(2) not in units:
            raise CWSandboxValidationError(f"invalid {name} quantity {value!r}")
        number, unit = float(match.group(1)), match.group(2)
    return number * units[unit]


def native_resources(value: object) -> Resources | None:
    """asyncsandbox :class:`~asyncsandbox.Resources` for the SDK's ``resources`` (a flat
    ``{"cpu", "memory"}`` dict, or ``{"requests": ..., "limits": ...}``; the limits
    apply). GPUs are cloud-only."""
    if value is None:
        return None
    raw = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value  # type: ignore[arg-type]
    if not isinstance(raw, Mapping):
        raise CWSandboxValidationError(f"resources must be a mapping, got {value!r}")
    if raw.get("gpu"):
        raise cloud_only("GPUs (resources['gpu'])")
    spec = raw.get("limits") or raw.get("requests") or raw
    if not isinstance(spec, Mapping):
        raise CWSandboxValidationError(f"invalid resources {value!r}")
    unknown = set(spec) - {"cpu", "memory", "gpu"}
    if unknown:
        raise CWSandboxValidationError(f"unknown resources {sorted(unknown)}; known: cpu, memory")
    cpus = None
    if spec.get("cpu") is not None:
        cpus = _quantity("cpu", spec["cpu"], {"": 1.0, "m": 0.001})
    memory_mb: int | None = Resources().memory_mb
    if spec.get("memory") is not None:
        memory_mb = max(1, math.ceil(_quantity("memory", spec["memory"], _MEMORY_UNITS) / 2**20))
    return Resources(cpus=cpus, memory_mb=memory_mb)


def native_network(value: object) -> str | None:
    """asyncsandbox's ``network`` for the SDK's: ``None`` (the default), or a
    ``NetworkOptions``-like mapping that denies egress (``"none"``). Allow-lists are
    cloud-only."""
    if value is None:
        return None
    raw = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value  # type: ignore[arg-type]
    if not isinstance(raw, Mapping):
        raise CWSandboxValidationError(
            f"network must be NetworkOptions or a mapping, got {value!r}"
        )
    if raw.get("egress") or raw.get("ingress"):
        raise cloud_only(
            "network allow-lists (egress/ingress rules)",
            "asyncsandbox sandboxes have no network by default",
        )
    return "none"


# -- metrics ------------------------------------------------------------------------------


@final
@dataclass(frozen=True)
class Dialect:
    """One spelling of the SDK: its module name, metric prefix and metric names."""

    name: str
    renames: Mapping[str, str]

    @property
    def prefix(self) -> str:
        return f"{self.name}/"

    def metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """asyncsandbox's metrics (unprefixed names) under this spelling's names."""
        return {self.prefix + self.renames.get(k, k): v for k, v in metrics.items()}


CWSANDBOX = Dialect("cwsandbox", {})
"""The names of ``cwsandbox`` (and of asyncsandbox): ``cwsandbox/exec_completed_ok``..."""
AVIATO = Dialect(
    "aviato",
    {
        "exec_completed_ok": "exec_successes",
        "exec_completed_nonzero": "exec_failures",
        "exec_failures": "exec_errors",
        "exec_completion_rate": "success_rate",
        "exec_failure_rate": "error_rate",
    },
)
"""The names of the ``aviato`` guide: ``exec_failures`` counts non-zero exits there, and
errors (timeouts, infrastructure) are ``exec_errors``."""
