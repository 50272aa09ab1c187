"""Reward function: score model completions by running each in its own sandbox.

The RL guide's first example on asyncsandbox: five toy completions (arithmetic, string
operations, a runtime error, a syntax error, a slow list) run in parallel sandboxes; results
are printed as they complete (faster ones first), then a summary in the original order with
the total reward and the pass rate. Reward: 1.0 when the program exits 0, else 0.0.

It uses the blocking facade, :mod:`asyncsandbox.sync`, as a TRL reward function would
(``trl_grpo.py``), and the guide's collection loop, ``wait(pending, num_returns=1)``.
``asyncsandbox demo`` runs the same scenario on the async API; the programs and the report
lines are shared with it.

Run it (no model, no GPU, no daemon)::

    uv run examples/reward_function.py
    uv run examples/reward_function.py --backend docker --image python:3.12-slim
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence

import _support

from asyncsandbox import SandboxDefaults
from asyncsandbox.demo import SEED_PROGRAMS, Outcome, outcome_of, progress_line, summary_lines
from asyncsandbox.sync import SyncSession, wait

EXECUTION_TIMEOUT_SECONDS = 10.0
RULE = "-" * 60


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    _support.add_backend_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=EXECUTION_TIMEOUT_SECONDS,
        help=f"seconds per completion (default {EXECUTION_TIMEOUT_SECONDS:g})",
    )
    args = parser.parse_args(argv)
    _support.configure_logging(args.verbose)

    job = uuid.uuid4().hex[:8]
    programs = SEED_PROGRAMS
    print(f"RL Training Reward Function Example (job: {job})")
    print("=" * 60)
    print(f"\nEvaluating {len(programs)} completions...\n")
    print("Progress (results arrive as executions complete):")
    print(RULE)

    defaults = SandboxDefaults(image=args.image, tags=("reward-function", f"job:{job}"))
    with SyncSession(
        args.backend, backend_options=_support.backend_options(args), defaults=defaults
    ) as session:
        # Launch every completion at once, each in a fresh sandbox that is removed when its
        # command ends; the handles come back immediately.
        handles = [
            session.run(["python3", "-c", program.code], timeout=args.timeout)
            for program in programs
        ]
        outcomes: list[Outcome] = []
        pending = list(handles)
        while pending:
            [handle], pending = wait(pending, num_returns=1)
            index = handles.index(handle)
            # A result scores 1.0 if the exit status is 0; a timeout scores 0.0; an
            # infrastructure failure (not the completion's fault) is an "error" to mask.
            error = handle.exception()
            outcome = outcome_of(
                index, programs[index], args.timeout, handle.result() if error is None else error
            )
            outcomes.append(outcome)
            print(progress_line(outcome, len(outcomes), len(programs)))
        stats = session.statistics()
    print(RULE)
    print("\nFinal summary (original order):")
    print(RULE)
    for line in summary_lines(outcomes, RULE):
        print(line)
    print(f"Sandboxes: {stats.sandboxes_started} started, {stats.sandboxes_removed} removed")
    return 0 if all(o.as_expected for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
