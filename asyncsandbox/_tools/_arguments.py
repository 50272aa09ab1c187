"""The tools' arguments: one Struct per tool validates them, and its JSON schema is the
tool's ``parameters``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ._results import ModelError

__all__ = (
    "Args",
    "Bash",
    "Editor",
    "Python",
    "ReadFile",
    "Submit",
    "WriteFile",
    "parameters",
    "parse",
)


class Args(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Bash(Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    command: Annotated[str, Meta(description="The shell command, e.g. `ls -la src`.")]
    timeout: (
        Annotated[float, Meta(gt=0, description="Seconds before it is killed.")] | UnsetType
    ) = UNSET


class Python(Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    code: Annotated[str, Meta(description="Python code; the last expression's value is shown.")]
    timeout: (
        Annotated[float, Meta(gt=0, description="Seconds before it is interrupted.")] | UnsetType
    ) = UNSET


PathArg = Annotated[str, Meta(description="Path of the file; relative to the working directory.")]


class ReadFile(Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: PathArg
    start_line: Annotated[int, Meta(ge=1, description="First line to read (1-based).")] | (
        UnsetType
    ) = UNSET
    end_line: Annotated[int, Meta(ge=1, description="Last line to read (inclusive).")] | (
        UnsetType
    ) = UNSET


class WriteFile(Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: PathArg
    content: Annotated[str, Meta(description="The complete new content of the file.")]


class Editor(Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    command: Annotated[
        Literal["view", "create", "str_replace", "insert"], Meta(description="What to do.")
    ]
    path: Annotated[str, Meta(description="Path of the file or directory.")]
    file_text: Annotated[str, Meta(description="`create`: content of the new file.")] | (
        UnsetType
    ) = UNSET
    old_str: (
        Annotated[
            str, Meta(description="`str_replace`: the exact text to replace; it must occur once.")
        ]
        | UnsetType
    ) = UNSET
    new_str: (
        Annotated[
            str, Meta(description="`str_replace`: the replacement. `insert`: the text to insert.")
        ]
        | UnsetType
    ) = UNSET
    insert_line: (
        Annotated[int, Meta(ge=0, description="`insert`: insert after this line (0: at the top).")]
        | UnsetType
    ) = UNSET
    view_range: (
        Annotated[
            list[int],
            Meta(
                min_length=2,
                max_length=2,
                description="`view`: [first, last] line to show, 1-based; last -1: to the end.",
            ),
        ]
        | UnsetType
    ) = UNSET


class Submit(Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


def parameters(kind: type[Args]) -> dict[str, Any]:
    schema = msgspec.json.schema(kind)
    params: dict[str, Any] = schema["$defs"][kind.__name__]
    params.pop("title", None)
    params.setdefault("properties", {})
    params.setdefault("required", [])
    params["additionalProperties"] = False
    for prop in params["properties"].values():
        if "enum" in prop:
            prop.setdefault("type", "string")  # msgspec omits it; some model APIs want it
    return params


def parse(name: str, arguments: object, kind: type[Args]) -> Args:
    raw: object
    if arguments is None:
        raw = {}
    elif isinstance(arguments, str | bytes | bytearray):
        if not arguments.strip():
            raw = {}  # some models send "" for a tool without arguments
        else:
            try:
                raw = msgspec.json.decode(arguments)
            except msgspec.DecodeError as exc:
                raise ModelError(f"the arguments of {name} are not valid JSON ({exc})") from None
    elif isinstance(arguments, Mapping):
        raw = dict(arguments)
    else:
        raise ModelError(f"the arguments of {name} must be a JSON object")
    if not isinstance(raw, dict):
        raise ModelError(f"the arguments of {name} must be a JSON object, not {type(raw).__name__}")
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ModelError(f"invalid arguments for {name}: {exc}") from None
