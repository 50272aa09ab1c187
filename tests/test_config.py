"""Configuration structs reject bad values and typos, on construction and from dicts."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from asyncsandbox import InvalidArgument, Limits, Resources, RetryPolicy, SandboxDefaults, Timeouts


def test_defaults_are_safe() -> None:
    d = SandboxDefaults()
    assert d.network == "none"
    assert d.resources.memory_mb is not None
    assert d.resources.pids is not None
    assert d.max_lifetime is not None


def test_typo_in_a_config_file_is_an_error() -> None:
    with pytest.raises(msgspec.ValidationError, match="imgae"):
        msgspec.convert({"imgae": "python:3.12"}, SandboxDefaults)
    with pytest.raises(TypeError):
        SandboxDefaults(imgae="python:3.12")  # type: ignore[call-arg]


def test_from_dict_validates_values() -> None:
    config = msgspec.convert(
        {"image": "python:3.12", "tags": ["a", "b"], "resources": {"memory_mb": 256}},
        SandboxDefaults,
    )
    assert config.tags == ("a", "b")
    assert config.resources.memory_mb == 256
    with pytest.raises(msgspec.ValidationError, match="max_live"):
        msgspec.convert({"max_live": 0}, Limits)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tags": "rl-training"}, "not a single string"),
        ({"tags": ["a,b"]}, "forbidden character"),
        ({"tags": ["x" * 200]}, "longer than"),
        ({"tags": [f"t{i}" for i in range(100)]}, "at most 64 tags"),
        ({"tags": [""]}, "non-empty"),
        ({"env": {"A=B": "x"}}, "invalid variable name"),
        ({"env": {"A": 1}}, "must be a str"),
        ({"env": {"A": "a\x00b"}}, "NUL"),
        ({"workdir": "relative/dir"}, "absolute path"),
        ({"network": "bridge"}, "network must be one of"),
        ({"max_lifetime": -1}, ">= 0"),
        ({"max_lifetime": 0}, "> 0"),
        ({"max_lifetime": math.nan}, "NaN"),
        ({"max_output_bytes": 0}, ">= 1"),
        ({"image": ""}, "non-empty"),
        ({"resources": {"memory_mb": 1}}, "Resources"),
    ],
)
def test_sandbox_defaults_reject(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        SandboxDefaults(**kwargs)


def test_workdir_is_normalised() -> None:
    assert SandboxDefaults(workdir="/srv//app/./x/..").workdir == "/srv/app"


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (Resources, {"memory_mb": 0}),
        (Resources, {"pids": -5}),
        (Resources, {"cpus": 0}),
        (Resources, {"cpus": math.inf}),
        (Limits, {"max_lifecycle": 0}),
        (Limits, {"capacity_timeout": -1.0}),
        (Limits, {"max_execs": True}),
        (Timeouts, {"create": math.nan}),
        (Timeouts, {"cleanup": 0}),
        (RetryPolicy, {"attempts": 0}),
    ],
)
def test_limits_and_timeouts_reject(cls: type[Any], kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        cls(**kwargs)


def test_merged_overrides() -> None:
    base = SandboxDefaults(tags=("run:1",), env={"A": "1", "B": "2"})
    merged = base.merged({"tags": ["episode:7"], "env": {"B": "x"}, "image": "img"})
    assert merged.tags == ("run:1", "episode:7")
    assert merged.env == {"A": "1", "B": "x"}
    assert merged.image == "img"
    assert base.merged({}) is base
    with pytest.raises(InvalidArgument, match="unknown sandbox option"):
        base.merged({"imgae": "x"})
