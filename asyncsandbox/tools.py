"""Agent tools for multi-step rollouts in one persistent sandbox: OpenAI-compatible tool
schemas, and a dispatcher that turns every failure into an observation the model can read::

    async with session.sandbox() as sandbox:
        toolbox = Toolbox(sandbox, tests="python3 -m pytest -q tests")
        messages, masked = [{"role": "user", "content": task}], False
        while not toolbox.done:
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=toolbox.schemas()
            )
            message = reply.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                result = await toolbox.call(call.function.name, call.function.arguments)
                messages.append(result.message(call.id))
                masked = masked or result.infrastructure_error
        reward = toolbox.reward  # None: never submitted (or the tests could not run)

The tools (``Toolbox(..., tools=[...])`` selects a subset):

``bash``
    ``command`` runs as ``["sh", "-c", command]`` in the sandbox's workdir; files persist
    between calls, shell state (``cd``, variables) does not. ``timeout`` in seconds, with a
    default and a maximum (``bash_timeout``, ``max_bash_timeout``).
``execute_bash``
    open-instruct's bash tool (its SWE-RL environment), offered only when asked for
    (``tools=[...]``): ``command`` runs in ``bash``, and the working directory and exported
    variables persist from one call to the next. Its observation is open-instruct's::

        Exit code: 0
        Execution output of [execute_bash]:
        [STDOUT]
        ...
        [STDERR]
        ...
``python``
    offered only when asked for (``tools=[...]``): ``code`` runs in the sandbox's stateful
    Python interpreter (:meth:`Sandbox.run_code <asyncsandbox.Sandbox.run_code>`, its
    default context): variables, imports and the working directory persist from one call to
    the next, the value of the last expression is shown, and images the code displays
    (matplotlib figures, ``_repr_png_``) come back as :attr:`ToolResult.images`. ``timeout``
    in seconds (``python_timeout``, ``max_python_timeout``): past it the code is
    interrupted and the interpreter keeps its state.
``read_file``
    ``path``, optionally ``start_line``/``end_line`` (1-based, inclusive): the text.
``write_file``
    ``path``, ``content``: create or replace a file (parent directories are created).
``str_replace_editor``
    ``command`` is ``view`` (a file with line numbers, optionally ``view_range``, or a
    directory listing two levels deep), ``create`` (a new file, ``file_text``),
    ``str_replace`` (``old_str`` must occur exactly once; it becomes ``new_str``) or
    ``insert`` (``new_str`` after line ``insert_line``; 0 is the top).
``submit``
    Runs the task's tests and ends the episode (``done``) with a ``reward``. Available when
    the environment says what the tests are (``tests=``): a command (exit status 0 means
    reward 1.0, anything else 0.0, a timeout 0.0) or an ``async (sandbox) -> float``, which
    may return a :class:`Grade` instead, to say what the observation shows.

Observations (:attr:`ToolResult.observation`):

* ``bash``: a status line, then stdout, then ``[stderr]`` and stderr when there is any::

      exit=1
      partial output
      [stderr]
      Traceback (most recent call last): ...

  The status line is ``exit=<code>``, with ``(killed by signal N)`` or ``(killed: out of
  memory)`` when that happened, or ``timed out after <T>s (the command was killed); output
  so far:`` followed by the partial output.
* ``python``: stdout, then ``[stderr]`` and stderr, then each displayed value as
  ``Out: <text>`` (an image as ``[image N: image/png, shown as an image]``), then the
  traceback of an exception; ``(no output)`` for none. A timeout starts it with
  ``timed out after <T>s (interrupted: the interpreter keeps its state); output so far:``,
  and an interpreter that had to be restarted ends it with a note that its state is gone.
* Failures read ``Error: <what happened>`` with a hint where one helps.
* Output is decoded as UTF-8 with replacement (never an exception). An observation longer
  than ``max_observation_chars`` keeps its head and tail around a
  ``[... N characters truncated ...]`` marker.

Failures are results, never exceptions: invalid JSON, missing or wrong-typed arguments,
unknown tools, missing files, directories, files too large, ambiguous edits, timeouts and
non-zero exits are the model's doing (``is_error``); a dead sandbox, an unreachable backend
or any other :class:`~asyncsandbox.InfrastructureError`, a sandbox stopped under the tools,
and a failing ``tests`` callable are not (``infrastructure_error`` too, so a trainer can
mask the episode instead of scoring it; they are also logged). Only cancellation
propagates.
"""

from ._tools._results import Grade, Tests, ToolImage, ToolResult
from ._tools._toolbox import TOOL_NAMES, Toolbox
from ._util import claim_public

__all__ = ("Toolbox", "ToolResult", "ToolImage", "Grade", "TOOL_NAMES", "Tests")

# Show public objects as `asyncsandbox.tools.X` (see asyncsandbox._util.claim_public).
claim_public(__name__, globals())
