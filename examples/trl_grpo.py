"""TRL GRPO with sandboxed code-execution rewards.

A real ``trl.GRPOTrainer`` run, on CPU, for a few steps. The policy is a tiny GPT-2 with
random weights and a tokenizer built here from a config (nothing is downloaded from a model
hub): single characters plus a few whole tokens the toy task uses (``<answer>``,
``print(``...), so that even an untrained model sometimes writes a well-formed answer. The
reward function extracts the code between ``<answer>`` tags from each completion and runs
it in a fresh sandbox through the blocking facade (:mod:`asyncsandbox.sync`): 1.0 if it
exits 0, 0.0 if it fails or times out or holds no code; ``None`` (TRL: not scored) if the
sandbox itself failed.

The reward function needs only asyncsandbox: ``from trl_grpo import CodeExecutionReward``
works without torch or TRL installed. The training needs the ``examples-trl`` dependency
group (torch, TRL, transformers, datasets); on this project's machines, CPU torch comes
from ``/opt/wheels``::

    uv sync --group examples-trl --find-links /opt/wheels --upgrade-package torch
    uv run examples/trl_grpo.py --steps 5
    uv run examples/trl_grpo.py --backend docker --image python:3.12-slim
"""

from __future__ import annotations

import argparse
import importlib
import os
import string
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import _support

from asyncsandbox import ExecTimeout, InfrastructureError, SandboxDefaults
from asyncsandbox.sync import SyncSession

EXECUTION_TIMEOUT_SECONDS = 10.0

SYSTEM_PROMPT = """You solve coding problems by writing Python code.
Put your code inside <answer> tags like this: <answer>print("hello")</answer>
Only include the code, no explanations."""

PROBLEMS = (
    "Print the product of 6 and 7.",
    "Print the sum of the numbers from 0 to 9.",
    "Print the word hello.",
    "Print the length of the string 'sandbox'.",
    "Print the square of 12.",
)
# Example answers for the warm-up (a real run starts from a pretrained model instead): right
# and wrong ones, and one without code, so the policy starts with a mix of rewards.
WARMUP_ANSWERS = (
    ("<answer>print(6*7)</answer>", "<answer>print(6*7</answer>"),
    ("<answer>print(sum(range(10)))</answer>", "<answer>print(sum(range(10))</answer>"),
    ("<answer>print('hello')</answer>", "<answer>print(hello)</answer>"),
    ("<answer>print(len('sandbox'))</answer>", "The answer is 7."),
    ("<answer>print(12*12)</answer>", "<answer>print(12**)</answer>"),
)


# -- the reward function (no heavy dependencies) --------------------------------------------


def extract_xml_answer(text: str) -> str:
    """The code inside the last ``<answer>...</answer>`` (to the end if unclosed); ``""``
    when there is no ``<answer>`` tag."""
    if "<answer>" not in text:
        return ""
    answer = text.split("<answer>")[-1]
    answer = answer.split("</answer>")[0]
    return answer.strip()


def completion_text(completion: object) -> str:
    """The text of one completion as TRL passes it: a string (standard format), or a list
    of messages (conversational format: the assistant's ``content``, a string or a list
    of ``{"type": "text", "text": ...}`` parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        texts = []
        for message in completion:
            if not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
                continue
            content = message.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, Sequence):
                texts += [
                    part["text"]
                    for part in content
                    if isinstance(part, Mapping) and isinstance(part.get("text"), str)
                ]
        return "\n".join(texts)
    raise TypeError(f"a completion is a string or a list of messages, got {completion!r}")


class CodeExecutionReward:
    """A TRL reward function: ``reward(completions=..., prompts=..., **kwargs)`` returns one
    reward per completion. Each completion's ``<answer>`` code runs in a fresh sandbox of
    ``session``; all of them at once, collected in order.

    Rewards: 1.0 (exit 0), 0.0 (non-zero exit, timeout, or no code), ``None`` when the
    sandbox failed (an infrastructure error, not the completion's fault: TRL ignores it).
    Each call prints the guide's line (``Reward call N: k sandboxes, p/k passed, s skipped
    (no code)``) and, when TRL passes ``log_metric``, logs the pass rate with its metrics.
    """

    def __init__(
        self,
        session: SyncSession,
        *,
        timeout: float = EXECUTION_TIMEOUT_SECONDS,
        out: IO[str] | None = None,
    ) -> None:
        self.session = session
        self.timeout = timeout
        self.out = out
        self.__name__ = "sandbox_execution"  # TRL names the reward's metrics after it
        self.calls = 0
        self.sandboxes = 0
        self.passed = 0
        self._lock = threading.Lock()

    def __call__(self, completions: Sequence[object], **kwargs: Any) -> list[float | None]:
        codes = [extract_xml_answer(completion_text(c)) for c in completions]
        # Launch every sandbox first: they run in parallel while we collect in order.
        handles = [
            (i, self.session.run(["python3", "-c", code], timeout=self.timeout))
            for i, code in enumerate(codes)
            if code
        ]
        rewards: list[float | None] = [0.0] * len(codes)
        passed = errors = 0
        for i, handle in handles:
            try:
                result = handle.result()
            except ExecTimeout:
                continue  # ran too long: 0.0
            except InfrastructureError:
                rewards[i] = None  # the sandbox failed, not the code: do not score it
                errors += 1
                continue
            if result.returncode == 0:
                rewards[i] = 1.0
                passed += 1
        with self._lock:
            self.calls += 1
            self.sandboxes += len(handles)
            self.passed += passed
            call = self.calls
        line = (
            f"  [asyncsandbox] Reward call {call}: {len(handles)} sandboxes, "
            f"{passed}/{len(handles)} passed"
        )
        skipped = len(codes) - len(handles)
        if skipped:
            line += f", {skipped} skipped (no code)"
        if errors:
            line += f", {errors} infrastructure errors (not scored)"
        print(line, file=self.out or sys.stdout, flush=True)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric("sandbox/pass_rate", passed / len(handles) if handles else 0.0)
            log_metric("sandbox/with_code", len(handles) / len(codes) if codes else 0.0)
        return rewards


# -- the training (torch, TRL, transformers, datasets) --------------------------------------

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")
# Whole tokens for the toy task's answers; everything else is spelled out character by
# character.
TASK_TOKENS = ("<answer>", "</answer>", "print(", "6*7", "sum(range(10))", "'hello'", "len(")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def training_modules() -> SimpleNamespace:
    """torch, tokenizers, transformers, datasets and TRL, imported when training starts:
    the reward function above works (and type-checks) without them."""
    try:
        return SimpleNamespace(
            **{
                name: importlib.import_module(name)
                for name in ("torch", "tokenizers", "transformers", "datasets", "trl")
            }
        )
    except ImportError as exc:
        raise SystemExit(
            f"the training needs the examples-trl dependency group ({exc}):\n"
            "  uv sync --group examples-trl --find-links /opt/wheels --upgrade-package torch"
        ) from None


def build_tokenizer(m: SimpleNamespace, directory: Path) -> Any:
    """A character-level tokenizer with the task's whole tokens, built with ``tokenizers``
    and saved to ``directory`` as a transformers tokenizer."""
    tk = m.tokenizers
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", "<unk>", *chars])}
    tok = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex("(?m)."), behavior="isolated")
    tok.decoder = tk.decoders.Fuse()
    tok.add_special_tokens(
        [tk.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS[3:]]
    )
    tok.add_tokens([tk.AddedToken(t, normalized=False) for t in TASK_TOKENS])
    tokenizer = m.transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return tokenizer


def build_model(m: SimpleNamespace, directory: Path, tokenizer: Any, *, seed: int) -> None:
    """A tiny GPT-2 (2 layers, 64 wide) with random weights, saved to ``directory``."""
    m.torch.manual_seed(seed)
    config = m.transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=512,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    m.transformers.GPT2LMHeadModel(config).save_pretrained(directory)


def prompt_messages(problem: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]


def warm_up(
    m: SimpleNamespace, directory: Path, tokenizer: Any, *, steps: int, learning_rate: float
) -> None:
    """A few supervised steps on :data:`WARMUP_ANSWERS`, so that the random model writes
    answers in the expected format, right and wrong (GRPO learns nothing from a group whose
    rewards are all equal)."""
    model = m.transformers.AutoModelForCausalLM.from_pretrained(directory)
    pairs = [
        (
            tokenizer.apply_chat_template(
                prompt_messages(problem), tokenize=False, add_generation_prompt=True
            ),
            answer + tokenizer.eos_token,
        )
        for problem, answers in zip(PROBLEMS, WARMUP_ANSWERS, strict=True)
        for answer in answers
    ]
    batch = tokenizer([p + a for p, a in pairs], return_tensors="pt", padding=True)
    # Learn the answers only (the batch is padded on the left: answers end every row).
    labels = batch["input_ids"].clone()
    for row, (_, answer) in enumerate(pairs):
        labels[row, : labels.shape[1] - len(tokenizer(answer)["input_ids"])] = -100
    optimizer = m.torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    if losses:
        print(
            f"Warm-up: {steps} supervised steps on example answers, loss {losses[0]:.2f} "
            f"-> {losses[-1]:.2f}"
        )
    model.save_pretrained(directory)


def train(args: argparse.Namespace, reward: CodeExecutionReward) -> None:
    # Everything is built here: make sure nothing reaches for a model hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    m = training_modules()
    # Deprecations inside transformers/TRL that no caller can act on.
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
    with tempfile.TemporaryDirectory(prefix="asyncsandbox-grpo-") as tmp:
        model_dir = Path(tmp, "model")
        print(f"Building a tiny GPT-2 and a character-level tokenizer in {model_dir}")
        tokenizer = build_tokenizer(m, model_dir)
        build_model(m, model_dir, tokenizer, seed=args.seed)
        warm_up(m, model_dir, tokenizer, steps=args.warmup_steps, learning_rate=5e-3)
        print("Creating toy dataset...")
        dataset = m.datasets.Dataset.from_list([{"prompt": prompt_messages(p)} for p in PROBLEMS])
        print(f"Dataset size: {len(dataset)} problems\n")
        print("Setting up GRPOTrainer...")
        config = m.trl.GRPOConfig(
            output_dir=str(Path(tmp, "output")),
            max_steps=args.steps,
            per_device_train_batch_size=args.num_generations,
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            learning_rate=args.learning_rate,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
            dataloader_pin_memory=False,
            seed=args.seed,
            disable_tqdm=True,
        )
        trainer = m.trl.GRPOTrainer(
            model=str(model_dir),
            reward_funcs=[reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        print(f"\nStarting training ({args.steps} steps)...")
        print("-" * 60)
        trainer.train()
        print("-" * 60)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    _support.add_backend_arguments(parser)
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument(
        "--num-generations", type=int, default=4, help="completions per prompt (default 4)"
    )
    parser.add_argument("--max-completion-length", type=int, default=24, help="in tokens")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=30,
        help="supervised steps on example answers before GRPO (default 30; 0: none)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=EXECUTION_TIMEOUT_SECONDS,
        help=f"seconds per completion (default {EXECUTION_TIMEOUT_SECONDS:g})",
    )
    args = parser.parse_args(argv)
    _support.configure_logging(args.verbose)

    job = uuid.uuid4().hex[:8]
    print(f"TRL GRPO Integration Example (job: {job})")
    print("=" * 60 + "\n")
    defaults = SandboxDefaults(image=args.image, tags=("trl-grpo", f"job:{job}"))
    started = time.monotonic()
    with SyncSession(
        args.backend, backend_options=_support.backend_options(args), defaults=defaults
    ) as session:
        reward = CodeExecutionReward(session, timeout=args.timeout)
        train(args, reward)
        stats = session.statistics()
    print(
        f"\nTraining completed successfully! ({time.monotonic() - started:.0f}s, "
        f"{reward.calls} reward calls, {reward.sandboxes} sandboxes, {reward.passed} passed; "
        f"{stats.sandboxes_started} started, {stats.sandboxes_removed} removed)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
