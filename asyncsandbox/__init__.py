"""asyncsandbox: run untrusted, model-written code in isolated sandboxes, thousands at a
time, from one async process (asyncio or trio)."""

from ._config import (
    Limits as Limits,
    Resources as Resources,
    RetryPolicy as RetryPolicy,
    SandboxDefaults as SandboxDefaults,
    Timeouts as Timeouts,
    WarmPool as WarmPool,
)
from ._errors import (
    BackendNotFound as BackendNotFound,
    BackendTimeout as BackendTimeout,
    BackendUnavailable as BackendUnavailable,
    CapacityTimeout as CapacityTimeout,
    CommandError as CommandError,
    ExecFailed as ExecFailed,
    ExecTimeout as ExecTimeout,
    FileErrorReason as FileErrorReason,
    InfrastructureError as InfrastructureError,
    InvalidArgument as InvalidArgument,
    LaunchError as LaunchError,
    OperationCancelled as OperationCancelled,
    RequestNotSent as RequestNotSent,
    SandboxClosed as SandboxClosed,
    SandboxDied as SandboxDied,
    SandboxError as SandboxError,
    SandboxFileError as SandboxFileError,
    SandboxNotFound as SandboxNotFound,
    SandboxOOMKilled as SandboxOOMKilled,
)
from ._interpreter import (
    CodeContext as CodeContext,
    CodeEvent as CodeEvent,
    Execution as Execution,
    ExecutionError as ExecutionError,
    Logs as Logs,
    OutputMessage as OutputMessage,
    Result as Result,
)
from ._limits import LimiterStatistics as LimiterStatistics
from ._metrics import MetricsReporter as MetricsReporter
from ._models import (
    ExecResult as ExecResult,
    OutputChunk as OutputChunk,
    SandboxInfo as SandboxInfo,
    SandboxStatus as SandboxStatus,
    Snapshot as Snapshot,
    SnapshotInfo as SnapshotInfo,
)
from ._operations import Operation as Operation, as_completed as as_completed, wait as wait
from ._registry import (
    available_backends as available_backends,
    create_backend as create_backend,
)
from ._sandbox import Sandbox as Sandbox
from ._session import Session as Session, SessionStatistics as SessionStatistics
from ._streams import (
    CodeStream as CodeStream,
    ExecStream as ExecStream,
    OutputHandler as OutputHandler,
)
from ._util import claim_public as _claim_public
from ._version import __version__ as __version__

__all__ = (
    # running sandboxes
    "Session",
    "Sandbox",
    "ExecStream",
    "CodeStream",
    "Operation",
    "wait",
    "as_completed",
    "available_backends",
    "create_backend",
    # configuration
    "SandboxDefaults",
    "Resources",
    "Limits",
    "Timeouts",
    "RetryPolicy",
    "WarmPool",
    # results
    "ExecResult",
    "OutputChunk",
    "SandboxInfo",
    "SandboxStatus",
    "Snapshot",
    # the code interpreter (Sandbox.run_code)
    "Execution",
    "Result",
    "Logs",
    "ExecutionError",
    "OutputMessage",
    "CodeContext",
    "CodeEvent",
    "OutputHandler",
    "SnapshotInfo",
    "SessionStatistics",
    "LimiterStatistics",
    "MetricsReporter",
    # errors
    "SandboxError",
    "InvalidArgument",
    "BackendNotFound",
    "SandboxClosed",
    "SandboxNotFound",
    "OperationCancelled",
    "CommandError",
    "ExecTimeout",
    "ExecFailed",
    "FileErrorReason",
    "SandboxFileError",
    "InfrastructureError",
    "CapacityTimeout",
    "BackendUnavailable",
    "RequestNotSent",
    "BackendTimeout",
    "LaunchError",
    "SandboxDied",
    "SandboxOOMKilled",
)

# Show public objects as `asyncsandbox.X`, msgspec Structs included.
_claim_public(__name__, globals())
