"""The SDK's sandbox options translated into asyncsandbox's (:class:`Settings`), and the
checks of the SDK's arguments that have no local meaning."""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from .._config import SandboxDefaults as NativeDefaults
from .._log import get_logger
from ._types import (
    CLOUD_OPTIONS,
    KEEP_ALIVE_ARGS,
    CWSandboxValidationError,
    SandboxDefaults,
    SandboxStatus,
    UnsupportedFeatureError,
    cloud_only,
    native_network,
    native_resources,
    unknown_argument,
)

__all__ = (
    "Settings",
    "check_cloud_arguments",
    "check_main_process",
    "check_report_to",
    "cloud_only_kwargs",
    "coerce_defaults",
    "native_defaults",
    "resolve_settings",
    "statuses",
)

_log = get_logger()
_images_noted: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Settings:
    """One sandbox's options, resolved: what the SyncSession is given, and what stays
    here (the default exec timeout, files to write at start)."""

    overrides: dict[str, Any]
    exec_timeout: float
    mounted_files: tuple[tuple[str, bytes], ...]


def statuses(status: object) -> set[SandboxStatus] | None:
    if status is None:
        return None
    values = [status] if isinstance(status, str) else status
    if not isinstance(values, Iterable):
        raise CWSandboxValidationError(f"status must be a SandboxStatus or a list, got {status!r}")
    try:
        return {SandboxStatus(str(v).lower()) for v in values}
    except ValueError:
        known = ", ".join(s.value for s in SandboxStatus)
        raise CWSandboxValidationError(f"unknown status in {status!r}; known: {known}") from None


def check_cloud_arguments(where: str, **values: Any) -> None:
    for name, value in values.items():
        if value is not None and value != () and value != []:
            raise cloud_only(f"{where}({name}=...)", CLOUD_OPTIONS.get(name, ""))


def coerce_defaults(defaults: object) -> SandboxDefaults:
    if defaults is None:
        return SandboxDefaults()
    if isinstance(defaults, SandboxDefaults):
        return defaults
    if isinstance(defaults, NativeDefaults):
        raise CWSandboxValidationError(
            "defaults is asyncsandbox.SandboxDefaults; this API takes the SDK's "
            "(asyncsandbox.compat.cwsandbox.SandboxDefaults, with container_image=...)"
        )
    if isinstance(defaults, Mapping):
        return SandboxDefaults.from_dict(defaults)
    raise CWSandboxValidationError(
        f"defaults must be SandboxDefaults or a mapping, got {defaults!r}"
    )


def check_report_to(report_to: object) -> bool:
    if report_to is None:
        return True
    if isinstance(report_to, str) or not isinstance(report_to, Iterable):
        raise CWSandboxValidationError(
            f"report_to must be a list such as ['wandb'], got {report_to!r}"
        )
    names = builtins.list(report_to)
    for name in names:
        if name != "wandb":
            raise CWSandboxValidationError(
                f"unknown report_to entry {name!r}: the SDK reports to 'wandb' only"
            )
    return bool(names)


def check_main_process(command: object, args: object) -> None:
    given = tuple(args) if isinstance(args, Iterable) else ()
    if command != "/bin/sh" or given != KEEP_ALIVE_ARGS:
        raise UnsupportedFeatureError(
            "a main process (command=/args=) is not supported: asyncsandbox sandboxes "
            "have no main process; start the program with exec()"
        )


def _image(backend: str, container_image: str) -> str | None:
    """The image the backend runs for ``container_image``: the process backend runs the
    host's system (or a root filesystem directory), never a registry image."""
    if backend != "process" or container_image.startswith("/"):
        return container_image
    if container_image not in _images_noted:
        _images_noted.add(container_image)
        _log.info(
            "compat.image.not_applied",
            container_image=container_image,
            detail="the process backend runs the host's system; backend='docker' runs images",
        )
    return None


def native_defaults(defaults: SandboxDefaults, backend: str) -> NativeDefaults:
    values: dict[str, Any] = {
        "image": _image(backend, defaults.container_image),
        "tags": defaults.tags,
        "env": dict(defaults.environment_variables),
    }
    if defaults.working_dir is not None:
        values["workdir"] = defaults.working_dir
    resources = native_resources(defaults.resources)
    if resources is not None:
        values["resources"] = resources
    network = native_network(defaults.network)
    if network is not None:
        values["network"] = network
    if defaults.max_lifetime_seconds is not None:
        values["max_lifetime"] = float(defaults.max_lifetime_seconds)
    return NativeDefaults(**values)


SANDBOX_ARGUMENTS = frozenset(
    {f.name for f in dataclasses.fields(SandboxDefaults)} | {"mounted_files"}
)


def resolve_settings(
    session_defaults: SandboxDefaults,
    base: SandboxDefaults,
    backend: str,
    kwargs: dict[str, Any],
    where: str,
) -> Settings:
    """The sandbox options of ``base`` (the defaults in force) and ``kwargs``, as
    overrides of ``session_defaults`` (the SyncSession's)."""
    for name in kwargs:
        if name not in SANDBOX_ARGUMENTS:
            raise unknown_argument(where, name, SANDBOX_ARGUMENTS)
    mounted = mounted_files(kwargs.pop("mounted_files", None))
    effective = base.with_overrides(
        **{k: v for k, v in kwargs.items() if k not in ("tags", "environment_variables")},
        tags=base.merge_tags(kwargs.get("tags")),
        environment_variables=base.merge_environment_variables(kwargs.get("environment_variables")),
    )
    for name in effective.cloud_options():
        raise cloud_only(f"{name}=", CLOUD_OPTIONS[name])
    check_main_process(effective.command, effective.args)
    session_native = native_defaults(session_defaults, backend)
    native = native_defaults(effective, backend)
    overrides: dict[str, Any] = {}
    if native.tags[: len(session_native.tags)] == session_native.tags:
        extra = native.tags[len(session_native.tags) :]
        if extra:
            overrides["tags"] = extra
    else:  # other defaults than the session's (a standalone Sandbox(defaults=...))
        raise CWSandboxValidationError("these tags cannot be expressed over the session's")
    if native.env != session_native.env:
        overrides["env"] = native.env
    for name in ("image", "workdir", "resources", "network", "max_lifetime"):
        if getattr(native, name) != getattr(session_native, name):
            overrides[name] = getattr(native, name)
    return Settings(overrides, float(effective.request_timeout_seconds), mounted)


def mounted_files(value: object) -> tuple[tuple[str, bytes], ...]:
    if value is None:
        return ()
    items: Iterable[Any]
    if isinstance(value, Mapping):
        items = [{"mount_path": k, "file_content": v} for k, v in value.items()]
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = value
    else:
        raise CWSandboxValidationError(f"mounted_files must be a list or a mapping, got {value!r}")
    out = []
    for item in items:
        if not isinstance(item, Mapping) or "mount_path" not in item:
            raise CWSandboxValidationError(f"a mounted file needs mount_path, got {item!r}")
        content = item.get("file_content", item.get("content", b""))
        if isinstance(content, str):
            content = content.encode()
        if not isinstance(content, bytes | bytearray):
            raise CWSandboxValidationError(f"file_content must be bytes, got {content!r}")
        out.append((str(item["mount_path"]), bytes(content)))
    return tuple(out)


def cloud_only_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    known = {
        "base_url",
        "auth",
        "timeout_seconds",
        "poll_retry_budget_seconds",
        "poll_rpc_timeout_seconds",
        "data_plane_mode",
    }
    for name in kwargs:
        if name not in known:
            raise unknown_argument("Sandbox.from_id()", name, known)
    return {k: v for k, v in kwargs.items() if k in ("base_url", "auth", "data_plane_mode")}
