"""The public surface: what users import is deliberate, documented and stable."""

from __future__ import annotations

import importlib
import inspect
import types
import typing

import msgspec
import pytest

import asyncsandbox
import asyncsandbox.abc
import asyncsandbox.cli
import asyncsandbox.compat
import asyncsandbox.compat.aviato
import asyncsandbox.compat.cwsandbox
import asyncsandbox.demo
import asyncsandbox.judge
import asyncsandbox.log
import asyncsandbox.sync
import asyncsandbox.testing
import asyncsandbox.tools

PUBLIC_MODULES = [
    asyncsandbox,
    asyncsandbox.abc,
    asyncsandbox.cli,
    asyncsandbox.compat,
    asyncsandbox.compat.cwsandbox,
    asyncsandbox.compat.aviato,
    asyncsandbox.demo,
    asyncsandbox.judge,
    asyncsandbox.log,
    asyncsandbox.sync,
    asyncsandbox.testing,
    asyncsandbox.tools,
]


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_all_is_a_tuple_of_existing_names(module: types.ModuleType) -> None:
    assert isinstance(module.__all__, tuple)
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_every_public_name_is_exported(module: types.ModuleType) -> None:
    """A public-looking name that is not in __all__ is surface drift."""
    defined = {
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "").startswith(module.__name__)
    }
    assert defined - set(module.__all__) == set()


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_public_items_are_documented(module: types.ModuleType) -> None:
    undocumented = [
        name
        for name in module.__all__
        if (inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name)))
        and not inspect.getdoc(getattr(module, name))
    ]
    assert undocumented == []


# The plugins' public modules: they claim their objects too.
PLUGIN_MODULES = [
    "asyncsandbox_docker",
    "asyncsandbox_e2b",
    "asyncsandbox_remote",
    "asyncsandbox_remote.server",
    "asyncsandbox_ray",
    "asyncsandbox_inspect",
    "asyncsandbox_langchain",
    "asyncsandbox_mcp",
    "asyncsandbox_openai_agents",
    "asyncsandbox_pydantic_ai",
    "asyncsandbox_smolagents",
]


def test_top_level_objects_claim_the_package() -> None:
    assert asyncsandbox.Session.__module__ == "asyncsandbox"
    assert asyncsandbox.ExecTimeout.__module__ == "asyncsandbox"
    assert asyncsandbox.wait.__module__ == "asyncsandbox"
    # msgspec Structs too
    assert repr(asyncsandbox.Limits) == "<class 'asyncsandbox.Limits'>"
    assert asyncsandbox.ExecResult.__module__ == "asyncsandbox"
    assert asyncsandbox.judge.JudgeResult.__module__ == "asyncsandbox.judge"


def _public_objects(name: str) -> list[tuple[str, object]]:
    module = importlib.import_module(name)
    return [
        (item, getattr(module, item))
        for item in module.__all__
        if inspect.isclass(getattr(module, item)) or inspect.isfunction(getattr(module, item))
    ]


@pytest.mark.parametrize("name", [m.__name__ for m in PUBLIC_MODULES] + PLUGIN_MODULES)
def test_public_objects_report_a_public_module(name: str) -> None:
    """What users import says where they import it from (reprs, tracebacks, help(), the API
    reference): never a private module's name."""
    private = [
        f"{item}: {obj.__module__}"
        for item, obj in _public_objects(name)
        if any(part.startswith("_") for part in obj.__module__.split("."))
    ]
    assert private == []


@pytest.mark.parametrize("name", [m.__name__ for m in PUBLIC_MODULES] + PLUGIN_MODULES)
def test_public_structs_still_resolve_their_field_types(name: str) -> None:
    """msgspec and typing.get_type_hints look a class's annotations up in the module its
    ``__module__`` names: claiming a Struct for a public module must not break decoding it."""
    for item, obj in _public_objects(name):
        if isinstance(obj, type) and issubclass(obj, msgspec.Struct):
            assert typing.get_type_hints(obj), item
            assert msgspec.json.Decoder(obj).type is obj  # resolves every field's type
            assert isinstance(msgspec.inspect.type_info(obj), msgspec.inspect.StructType), item


def test_public_async_methods_say_how_they_cancel() -> None:
    """Every public coroutine method of Session and Sandbox documents cancellation or is
    trivially bounded."""
    exempt = {
        "info",
        "list",
        "gc",
        "delete",
        "read_file",
        "write_file",
        "upload",
        "download",
        "start",
    }
    for cls in (asyncsandbox.Session, asyncsandbox.Sandbox):
        for name, func in vars(cls).items():
            if name.startswith("_") or not inspect.iscoroutinefunction(func) or name in exempt:
                continue
            assert "Cancellation" in (func.__doc__ or ""), f"{cls.__name__}.{name}"


def test_error_tree() -> None:
    """Timeouts are builtin TimeoutErrors; command outcomes and infrastructure failures are
    disjoint, so trainers can mask the latter."""
    e = asyncsandbox
    for timeout in (e.ExecTimeout, e.BackendTimeout, e.CapacityTimeout):
        assert issubclass(timeout, TimeoutError)
        assert issubclass(timeout, e.SandboxError)
    for infra in (
        e.SandboxDied,
        e.SandboxOOMKilled,
        e.BackendUnavailable,
        e.RequestNotSent,
        e.BackendTimeout,
        e.CapacityTimeout,
        e.LaunchError,
    ):
        assert issubclass(infra, e.InfrastructureError)
        assert not issubclass(infra, e.CommandError)
    for outcome in (e.ExecTimeout, e.ExecFailed):
        assert issubclass(outcome, e.CommandError)
        assert not issubclass(outcome, e.InfrastructureError)
    assert issubclass(e.InvalidArgument, ValueError)
    assert "InfrastructureError" in (e._errors.__doc__ or "")
