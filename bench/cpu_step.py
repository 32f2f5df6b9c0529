"""A GRPO step of the real Qwen2.5-Coder-0.5B on the CPU, against the machine's limits, before and after
cpu_training.py's changes, in one process.

train.py's own run at 2 prompts x 8 completions of up to 256 tokens (lr 5e-5, the project's defaults
otherwise, the bundled problems, no held-out evaluation), timed per optimizer step: sampling and reward by
wrapping the GRPOTrainer methods that do them, the update as the rest of TRL's step time. Each part is put
against its limit, measured in the same run:

- the update: its FLOPs (forward and backward through the frozen weights, 4 x the non-embedding parameters
  per token of prompt and completion, and 4 x the LM head's per completion token, the only ones scored)
  at the bf16 matrix-multiply rate measured on this machine, now (torch.mm at the update's shapes);
- sampling: each decoding step reads every weight once (the LM head included) for all sequences together,
  so it takes at least the weights' bytes at the rate a 16-row matmul streams weights from memory
  (measured, now, in the faster of two weight layouts) or its FLOPs at the matmul rate, whichever is
  longer; plus the prompts' prefill FLOPs;
- the reward: the OCaml toolchain in its sandbox, no matrix work: its time only.

Arms, each a run of train.py in this process (the machine is shared, so ratios between arms, not absolute
seconds, are the result; the load average is printed with each):

    before         TRL's and transformers' own CPU path: no autocast (PEFT multiplies the LoRA in float32),
                   the LM head over every position, SDPA's grouped-query kernel where the mask is None,
                   TRL's sampling, TRL's passes of GRPO_BATCH_SIZE completions
    after          as shipped: cpu_training.py's choices and generation.PlainSampler
    unshared       after with TRL's scoring in the update (every row's prompt, every column of the round;
                   TRL's shuffled passes of GRPO_BATCH_SIZE): what shared_prompts.py saves the update (not
                   in the default arms)
    split-groups   after with TRL's passes of GRPO_BATCH_SIZE completions, each run in one forward up to
                   its longest (a group's prompt once a pass, so 4 times in a group of 8 at passes of 2):
                   what a pass of a whole group in forwards of like lengths saves (not in the default arms)
    torch-dropout  after with torch's own dropout masks, one draw of its CPU generator an element: what
                   drawing them from 16 random bits an element saves the update (not in the default arms)
    trl-head       after with TRL's own folds of the LM head's tiles and its float32 GEMM for the head's
                   gradient (the chunked log-probabilities, on devices without Triton): what
                   cpu_training.lean_lm_head saves the update (not in the default arms)
    peft-lora      after with PEFT's own LoRA forward: what cpu_training.lean_lora saves the update and
                   sampling's layers outside grouped_lora's groups (not in the default arms)
    ungrouped      after with each LoRA layer of a decoding step run alone: what grouped_lora's one product
                   for the layers of one input saves sampling (not in the default arms)
    repeat-kv      after with transformers' copies of each key/value head for its query heads in the
                   attention of several queries: what cpu_training.packed_gqa saves the update (not in the
                   default arms)
    row-major      after with sampling's weights multiplied in PyTorch's row-major layout: what
                   packed_weights' copies in oneDNN's layout save sampling (not in the default arms)
    no-dropout     after with --lora-dropout 0 (the default is the seed's 0.05): what LoRA dropout's random
                   masks still cost the update (not in the default arms)

Every arm runs at the threads train.py picks from the load (cpu_training.use_free_cores); what that choice is
worth shows in the bf16 matmul rate printed first at one thread and at torch's default.

    .venv/bin/python bench/cpu_step.py                    # the real 0.5B (make real-model first)
    .venv/bin/python bench/cpu_step.py --arms after --steps 3
    .venv/bin/python bench/cpu_step.py --tiny             # the tiny random model in bf16: a smoke run
    .venv/bin/python bench/cpu_step.py --sft --steps 4    # train.py --sft's steps instead (SFT_BATCH_SIZE 4)

With --sft each arm is `train.py --sft` (the supervised warm start on the bundled problems' reference
solutions, its defaults): seconds and tokens/s per optimizer step against the update's limit, counted the
same way (the LM head for the answer tokens only, where the loss is; TRL's SFT computes it everywhere).
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer, SFTTrainer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cpu_training  # noqa: E402
import demo  # noqa: E402
import generation  # noqa: E402
import packed_weights  # noqa: E402
import shared_prompts  # noqa: E402
import train  # noqa: E402
from bench.train_step import timed  # noqa: E402
from problems import BUNDLED_PROBLEMS  # noqa: E402
from real_model import MODELS  # noqa: E402

PROMPTS, GENERATIONS, MAX_COMPLETION = 2, 8, 256
TINY_COMPLETION = 32  # --tiny is a smoke run
SHAPE = [
    *("--batch-size", str(PROMPTS), "--num-generations", str(GENERATIONS), "--grad-accum-steps", "1"),
    *("--learning-rate", "5e-5"),
]
ARMS = (
    *("before", "after", "unshared", "split-groups", "torch-dropout", "trl-head", "peft-lora", "ungrouped"),
    *("repeat-kv", "row-major", "no-dropout"),
)
DEFAULT_ARMS = "before,after"
# The arms compared, each as (slower, faster): the change an arm leaves out, or what dropout costs.
PAIRS = (
    ("before", "after"),
    ("unshared", "after"),
    ("split-groups", "after"),
    ("torch-dropout", "after"),
    ("trl-head", "after"),
    ("peft-lora", "after"),
    ("ungrouped", "after"),
    ("repeat-kv", "after"),
    ("row-major", "after"),
    ("after", "no-dropout"),
)
# The real 0.5B's widths, where the machine's rates are measured (for --tiny too: they are the machine's).
QWEN_0_5B_WIDTH, QWEN_0_5B_INTERMEDIATE, QWEN_0_5B_VOCAB = 896, 4864, 151936


def matmul_rate(rows: int, width: int, out: int, repeats: int = 10) -> float:
    """FLOP/s of a bf16 torch.mm (rows x width) @ (width x out) at the process's threads: the median of
    `repeats` timed calls after one warm-up."""
    a = torch.randn(rows, width, dtype=torch.bfloat16)
    b = torch.randn(width, out, dtype=torch.bfloat16)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * rows * width * out / statistics.median(times)


def weight_read_rate(rows: int) -> float:
    """Bytes/s at which a `rows`-row bf16 matmul streams a weight from memory: the real 0.5B's LM head (its
    largest weight, 151,936 x 896, 272 MB, far beyond the caches), a decoding step's kind of work; the faster
    of the weight in PyTorch's layout and in oneDNN's (packed_weights, where this CPU multiplies bf16)."""
    weight = torch.randn(QWEN_0_5B_VOCAB, QWEN_0_5B_WIDTH, dtype=torch.bfloat16)
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    rates = []
    with torch.no_grad(), packed_weights.held():
        for product in (torch.nn.functional.linear, packed_weights.linear):
            product(x, weight)
            times = []
            for _ in range(5):
                start = time.perf_counter()
                product(x, weight)
                times.append(time.perf_counter() - start)
            rates.append(weight.numel() * weight.element_size() / statistics.median(times))
    return max(rates)


def model_sizes(model_dir: Path) -> dict[str, int]:
    """Parameter counts of the model (on the meta device: nothing loaded): the decoder layers' ("body"), the
    LM head's, and those a decoding step reads ("read": all but the input embedding, of which it reads a row
    per sequence; a head tied to it is read as the head)."""
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # a tied head counted once
    body = total - embedding.numel() - (0 if head is embedding else head.numel())
    return {"parameters": total, "body": body, "head": head.numel(), "read": body + head.numel()}


def limits(step: dict, sizes: dict[str, int], rate: float, read_rate: float, weight_bytes: int) -> dict:
    """Seconds the step's sampling and update take at least at the measured rates."""
    completions = PROMPTS * GENERATIONS
    completion_tokens = step["completions/mean_length"] * completions
    prompt_tokens = step["tokens"] - completion_tokens
    decoding_steps = step["completions/max_length"]  # one generate call runs until its longest ends
    per_decoding_step = max(sizes["read"] * weight_bytes / read_rate, 2 * sizes["read"] * completions / rate)
    prefill = 2 * sizes["body"] * prompt_tokens / rate  # the head only at the last position
    update_flops = 4 * sizes["body"] * step["tokens"] + 4 * sizes["head"] * completion_tokens
    return {"sampling": decoding_steps * per_decoding_step + prefill, "update": update_flops / rate}


UPDATE_PASSES = cpu_training.update_passes


def trl_passes(cfg, processes: int, peak_bytes, memory_bytes: int):
    """cpu_training.update_passes as for two processes: TRL's passes of GRPO_BATCH_SIZE completions."""
    return UPDATE_PASSES(cfg, max(processes, 2), peak_bytes, memory_bytes)


def one_forward(lengths: list[int], overhead: int = 0) -> list[list[int]]:
    """shared_prompts.length_buckets as before it: a pass's rows in one forward, up to the longest."""
    return [list(range(len(lengths)))] if lengths else []


@contextlib.contextmanager
def arm(name: str):
    """`before`: cpu_training's choices switched off (train.py then runs TRL's own CPU path); `unshared`,
    `split-groups`, `torch-dropout`, `trl-head`, `peft-lora`, `ungrouped`, `repeat-kv` and `row-major`: its
    shared prompts in the update, its passes of a whole group with forwards of like lengths, its dropout
    masks, its LM head's folds, its LoRA forward, sampling's groups of LoRA layers, attention's packed query
    heads, or sampling's weights in oneDNN's layout, alone."""
    with contextlib.ExitStack() as stack:

        def patch(owner, attribute: str, value) -> None:
            stack.enter_context(mock.patch.object(owner, attribute, value))

        if name in ("before", "unshared", "split-groups"):
            patch(cpu_training, "update_passes", trl_passes)
        if name == "before":
            patch(cpu_training, "model_bf16_autocast", lambda model_id: torch.cuda.is_available())
            patch(cpu_training, "fast_kernels", lambda *args: contextlib.nullcontext())
        if name == "unshared":
            patch(cpu_training, "shared_prompt_passes", contextlib.nullcontext)
        if name == "split-groups":
            patch(shared_prompts, "length_buckets", one_forward)
        if name == "torch-dropout":
            patch(cpu_training, "dropout_masks_from_bits", contextlib.nullcontext)
        if name == "trl-head":
            patch(cpu_training, "lean_lm_head", contextlib.nullcontext)
        if name == "peft-lora":
            patch(cpu_training, "lean_lora", contextlib.nullcontext)
        if name == "ungrouped":
            patch(generation, "grouped_lora", lambda model, buffers: contextlib.nullcontext())
        if name == "repeat-kv":
            patch(cpu_training, "packed_gqa", contextlib.nullcontext)
        if name == "row-major":
            patch(packed_weights, "supported", lambda: False)
        yield


def run(name: str, flags: list[str], out: Path) -> list[dict]:
    """train.py's run under arm `name`: one dict per optimizer step (its metrics and the timed parts)."""
    sampling, reward = defaultdict(float), defaultdict(float)
    with (
        arm(name),
        mock.patch.object(GRPOTrainer, "_generate", timed(GRPOTrainer._generate, sampling)),
        mock.patch.object(GRPOTrainer, "_calculate_rewards", timed(GRPOTrainer._calculate_rewards, reward)),
    ):
        if train.main([*flags, "--output-dir", str(out)], environ={}) != 0:
            raise SystemExit(1)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps, tokens_before = [], 0
    for row in (r for r in rows if "step_time" in r):
        n = row["step"]
        steps.append(
            {
                **row,
                "tokens": row["num_tokens"] - tokens_before,  # num_tokens is cumulative
                "sampling": sampling[n],
                "reward": reward[n],
                "update": row["step_time"] - sampling[n] - reward[n],
            }
        )
        tokens_before = row["num_tokens"]
    return steps


def sft_run(name: str, flags: list[str], out: Path) -> list[dict]:
    """train.py --sft's run under arm `name`: per optimizer step its seconds (SFTTrainer.training_step,
    timed), tokens (all) and answer tokens (those with a label)."""
    seconds, tokens, answer = defaultdict(float), defaultdict(int), defaultdict(int)
    original = SFTTrainer.training_step

    def counted(trainer, model, inputs, *args, **kwargs):
        step = trainer.state.global_step + 1
        tokens[step] += int(inputs["attention_mask"].sum())
        answer[step] += int((inputs["labels"] != -100).sum()) if "labels" in inputs else 0
        return original(trainer, model, inputs, *args, **kwargs)

    with arm(name), mock.patch.object(SFTTrainer, "training_step", timed(counted, seconds)):
        if train.main(["--sft", *flags, "--output-dir", str(out)], environ={}) != 0:
            raise SystemExit(1)
    return [
        {"step": n, "update": seconds[n], "tokens": tokens[n], "answer": answer[n]} for n in sorted(seconds)
    ]


def step_line(name: str, step: dict, limit: dict) -> str:
    completions = PROMPTS * GENERATIONS
    completion_tokens = step["completions/mean_length"] * completions
    parts = [
        f"sampling {step['sampling']:.1f} s ({completion_tokens / step['sampling']:.0f} tokens/s; limit "
        f"{limit['sampling']:.1f} s, {step['sampling'] / limit['sampling']:.1f}x)",
        f"reward {step['reward']:.1f} s ({completion_tokens / step['reward']:.0f} tokens/s)",
        f"update {step['update']:.1f} s ({step['tokens'] / step['update']:.0f} tokens/s; limit "
        f"{limit['update']:.1f} s, {step['update'] / limit['update']:.1f}x)",
    ]
    return (
        f"{name} step {step['step']}: {step['step_time'] / completions:.2f} s a completion; "
        + "; ".join(parts)
        + f"; {completion_tokens:.0f} completion tokens (longest {step['completions/max_length']:.0f})"
    )


def sft_summary(name: str, steps: list[dict], sizes: dict[str, int], rate: float, load: float) -> dict:
    """Print each SFT step against the update's limit; the means of the steps after the first."""
    for step in steps:
        limit = (4 * sizes["body"] * step["tokens"] + 4 * sizes["head"] * step["answer"]) / rate
        print(
            f"{name} SFT step {step['step']}: {step['update']:.1f} s ({step['tokens'] / step['update']:.0f} "
            f"tokens/s; limit {limit:.1f} s, {step['update'] / limit:.1f}x); {step['tokens']} tokens, "
            f"{step['answer']} of them answer tokens",
            flush=True,
        )
    timed_steps = steps[1:] or steps
    seconds, tokens = sum(s["update"] for s in timed_steps), sum(s["tokens"] for s in timed_steps)
    return {"s a step": seconds / len(timed_steps), "tokens/s": tokens / seconds, "load": load}


def print_sft_table(summary: dict[str, dict]) -> None:
    print("\nMeans of the steps after the first; load: the 1-minute load average when the arm started")
    print("\n| arm | SFT s a step | tokens/s | load |")
    print("|---|---|---|---|")
    for name, row in summary.items():
        print(f"| {name} | {row['s a step']:.1f} | {row['tokens/s']:.0f} | {row['load']:.1f} |")
    for slower, faster in PAIRS:
        if slower in summary and faster in summary:
            ratio = summary[faster]["tokens/s"] / summary[slower]["tokens/s"]
            print(f"\n{faster} / {slower} tokens/s: {ratio:.2f}x")


def bf16_tiny_model(path: Path) -> Path:
    """The demo's tiny model, saved in bf16 so that the smoke run takes the real model's path."""
    folder = demo.build_tiny_model(path.parent / "tiny-float32")
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(path)
    AutoTokenizer.from_pretrained(folder).save_pretrained(path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per arm")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--sft", action="store_true", help="time train.py --sft's steps instead of GRPO's")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help=f"the tiny random model in bf16, completions of up to {TINY_COMPLETION} tokens: a smoke run",
    )
    args = parser.parse_args()
    arms = args.arms.split(",")
    if args.steps < 1 or any(a not in ARMS for a in arms):
        parser.error(f"--steps: at least 1; --arms: of {', '.join(ARMS)}")

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = bf16_tiny_model(Path(tmp) / "tiny") if args.tiny else MODELS["0.5b"].folder
        max_completion = TINY_COMPLETION if args.tiny else MAX_COMPLETION
        if not (model_dir / "config.json").is_file():
            parser.error(f"{model_dir}: no model there; run `make real-model` first (or use --tiny)")
        flags = [
            *("--model-id", str(model_dir), "--training-dataset", str(BUNDLED_PROBLEMS)),
            *("--max-steps", str(args.steps), "--save-steps", str(args.steps + 1), "--eval-steps", "none"),
            *("--sft-max-steps", str(args.steps)),
            *("--report-to", "none"),
            *SHAPE,
            *(() if args.sft else ("--max-completion", str(max_completion))),  # SFT's answers: the default
        ]
        sizes = model_sizes(model_dir)
        model = "tiny random model (--tiny)" if args.tiny else "real Qwen2.5-Coder-0.5B (Q4_K_M, in bf16)"
        print(
            f"{model}: {sizes['parameters'] / 1e6:.0f}M parameters; CPU, {torch.get_num_threads()} cores; "
            f"{PROMPTS} prompts x {GENERATIONS} completions of up to {max_completion} tokens"
        )
        summary, threads = {}, torch.get_num_threads()
        shape = (PROMPTS * 700, QWEN_0_5B_WIDTH, QWEN_0_5B_INTERMEDIATE)
        torch.set_num_threads(1)
        one = matmul_rate(*shape)
        torch.set_num_threads(threads)
        print(
            f"bf16 matmul at load average {os.getloadavg()[0]:.1f}: {one / 1e9:.0f} GFLOP/s on one thread, "
            f"{matmul_rate(*shape) / 1e9:.0f} on {threads}"
        )
        for name in arms:
            torch.set_num_threads(threads)  # train.py chooses from these by the load (cpu_training)
            load = os.getloadavg()[0]
            # The rates at the threads the run will take: OMP_NUM_THREADS's, or cpu_training.use_free_cores's.
            chosen = "OMP_NUM_THREADS" in os.environ
            run_threads = threads if chosen else cpu_training.threads_for(threads, load)
            torch.set_num_threads(run_threads)
            rate, read_rate = matmul_rate(*shape), weight_read_rate(PROMPTS * GENERATIONS)
            torch.set_num_threads(threads)
            extra = ["--lora-dropout", "0"] if name == "no-dropout" else []
            print(
                f"\n{name}: load average {load:.1f}; {run_threads} threads: bf16 matmul {rate / 1e9:.0f} "
                f"GFLOP/s; weights streamed at {read_rate / 1e9:.1f} GB/s"
                + (f"; train.py {' '.join(extra)}" if extra else ""),
                flush=True,
            )
            arm_flags = [*flags, *extra]
            if args.sft:
                sft_steps = sft_run(name, arm_flags, Path(tmp) / name)
                summary[name] = sft_summary(name, sft_steps, sizes, rate, load)
                continue
            steps = run(name, arm_flags, Path(tmp) / name)
            for step in steps:
                print(step_line(name, step, limits(step, sizes, rate, read_rate, 2)), flush=True)
            timed_steps = steps[1:] or steps  # the first step is a warm-up where there are others
            parts = ("sampling", "reward", "update")
            summary[name] = {part: statistics.mean(s[part] for s in timed_steps) for part in parts}
            summary[name]["per completion"] = statistics.mean(
                s["step_time"] / (PROMPTS * GENERATIONS) for s in timed_steps
            )
            summary[name]["load"] = (load + os.getloadavg()[0]) / 2

    if args.sft:
        print_sft_table(summary)
        return 0
    means = f"steps 2-{args.steps} (step 1 a warm-up)" if args.steps > 1 else "the one step"
    print(f"\nMeans of {means}; seconds; load: the 1-minute load average")
    print("\n| arm | s a completion | sampling s | reward s | update s | load |")
    print("|---|---|---|---|---|---|")
    for name, row in summary.items():
        print(
            f"| {name} | {row['per completion']:.2f} | {row['sampling']:.1f} | {row['reward']:.1f} | "
            f"{row['update']:.1f} | {row['load']:.1f} |"
        )
    for slower, faster in PAIRS:
        if slower in summary and faster in summary:
            ratios = ", ".join(
                f"{part} {summary[slower][part] / summary[faster][part]:.2f}x"
                for part in ("per completion", "sampling", "update")
            )
            print(f"\n{slower} / {faster}: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
