"""An inspect_ai sandbox provider backed by asyncsandbox: ``sandbox="asyncsandbox"``.

inspect_ai imports this package through its ``inspect_ai`` entry point, which registers
the provider.
"""

from ._provider import (
    AsyncSandboxConfig as AsyncSandboxConfig,
    AsyncSandboxEnvironment as AsyncSandboxEnvironment,
)

__all__ = ("AsyncSandboxConfig", "AsyncSandboxEnvironment")
