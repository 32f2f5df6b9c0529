"""Milliseconds per decoding step of the compiled sampler at the seed's shape, for the sampler as it was and
with each of its changes added in turn, and where the time goes, in one process.

Arms, each adding one change to the one before (issue 23), the last being the sampler as shipped:

    before        the LoRA in float32, dynamo's module guards checked every step, key/value heads copied
    +bf16-lora    the LoRA multiplied in its base layer's dtype (generation.lora_in_base_dtype)
    +no-guards    module guards left out, checked once a call instead (generation.compile_config)
    +sdpa-gqa     SDPA's own grouped-query attention (generation.grouped_query_attention)
    +end-checks   the generate loop looks every 8 steps whether every sequence has ended, not after each
                  step (generation.ends_checked_every): as shipped

Each arm compiles its own graph (dynamo's cache emptied), samples one round to compile and two timed rounds,
then one round under torch's profiler, which splits a decoding step's time: dynamo's guard checks before
the compiled step (`TorchDynamo Cache Lookup`), the CUDA graph's launch, the host waiting on the GPU
(synchronisations), and the GPU's own busy time; the rest of the wall time is Python and transformers'
generate loop. A last round counts the host's reads of tensor values (bool(), .item(), ...: each one a wait
for the GPU on CUDA). On the CPU only the host-side columns exist: the guard checks and the reads are
measured there as on a GPU.

The model is Qwen2.5-Coder-1.5B's architecture with random bf16 weights (as bench/train_step.py builds it),
LoRA r 32 on all seven projections with a real effect, 24 sequences (4 prompts x 6) of the bundled problems'
prompts, a cache of 704 prompt + 512 completion positions. `--tiny` keeps the seed's module structure (28
layers, 7 LoRA projections each, 12 query and 2 key/value heads) at a width of 96, on the CPU,
with 64 completion tokens: what the host does per step depends on the modules, not their width.

    .venv/bin/python bench/sampler_step.py          # on a GPU box
    .venv/bin/python bench/sampler_step.py --tiny   # on the CPU
    .venv/bin/python bench/sampler_step.py --tiny --arms before,+end-checks --new-tokens 4   # a smoke run
"""

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import torch
from peft import LoraConfig, get_peft_model
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import demo  # noqa: E402
import generation  # noqa: E402
from bench.train_step import (  # noqa: E402
    BATCH,
    GENERATIONS,
    MAX_COMPLETION,
    MAX_PROMPT,
    QWEN_CODER_1_5B,
    build_random_qwen,
    device_name,
    give_lora_an_effect,
    prompt_batch,
)
from problems import BUNDLED_PROBLEMS, load_problems  # noqa: E402
from run_records import quiet_libraries  # noqa: E402

SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TINY_COMPLETION = 64
TIMED_ROUNDS = 2
SHIPPED_COMPILE_CONFIG = generation.compile_config

# Profiler event names, summed over a round and divided by its decoding steps.
GUARDS = ("TorchDynamo Cache Lookup",)
GRAPH_LAUNCH = ("cudaGraphLaunch",)
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def compile_config_with_guards(device: torch.device):
    """The shipped compile settings less the guard filter: every module guard checked on every step."""
    config = SHIPPED_COMPILE_CONFIG(device)
    config.options = {k: v for k, v in config.options.items() if k != "guard_filter_fn"} or None
    return config


def unchanged(policy, copies) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


# Each arm names the changes it leaves out, as patches of the generation module's functions.
LEFT_OUT: dict[str, list[tuple[str, Callable]]] = {
    "bf16 LoRA": [("lora_in_base_dtype", unchanged)],
    "no guards": [("compile_config", compile_config_with_guards)],
    "SDPA GQA": [("grouped_query_attention", contextlib.nullcontext)],
    "end checks": [("ends_checked_every", lambda steps, max_length: contextlib.nullcontext())],
}
ARMS = {
    "before": ["bf16 LoRA", "no guards", "SDPA GQA", "end checks"],
    "+bf16-lora": ["no guards", "SDPA GQA", "end checks"],
    "+no-guards": ["SDPA GQA", "end checks"],
    "+sdpa-gqa": ["end checks"],
    "+end-checks": [],  # the sampler as shipped
}
# The host's reads of a tensor's value: each waits for the GPU to finish what it was given.
DEVICE_READS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def changes_left_out(names: list[str]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for name in names:
            for function, replacement in LEFT_OUT[name]:
                stack.enter_context(mock.patch.object(generation, function, replacement))
        yield


@contextlib.contextmanager
def device_reads() -> Iterator[list[int]]:
    """A count (its one item) of the host's reads of tensor values while open, on any device."""
    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in DEVICE_READS}

    def counted(method: Callable) -> Callable:
        def read(self, *args, **kwargs):
            count[0] += 1
            return method(self, *args, **kwargs)

        return read

    for name, method in originals.items():
        setattr(torch.Tensor, name, counted(method))
    try:
        yield count
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def build_tiny_seed_structure(path: Path) -> Path:
    """The seed model's module structure (28 layers, 12 query and 2 key/value heads) at width 96."""
    demo.build_tiny_model(path, layers=QWEN_CODER_1_5B["num_hidden_layers"], width=96)
    config = AutoConfig.from_pretrained(path)
    config.num_attention_heads = QWEN_CODER_1_5B["num_attention_heads"]
    config.num_key_value_heads = QWEN_CODER_1_5B["num_key_value_heads"]
    config.head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def lora_model(path: Path, device: torch.device):
    """bf16 weights, a float32 LoRA (as PEFT makes it) of r 32 on the seven projections, with an effect."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device)
    model = get_peft_model(
        model, LoraConfig(r=32, lora_alpha=64, target_modules=SEVEN, task_type="CAUSAL_LM")
    )
    give_lora_an_effect(model, std=0.01)
    return model


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_step_ms(events, names: tuple[str, ...], steps: int) -> float:
    return sum(e.cpu_time_total for e in events if e.key in names) / 1000 / steps


def gpu_busy_ms(events, steps: int) -> float:
    busy = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return busy / 1000 / steps


def measure_arm(model, ids, mask, config: GenerationConfig, left_out: list[str]) -> dict[str, float]:
    """One arm: compile, timed rounds, a profiled round; figures per decoding step."""
    device = ids.device
    torch.compiler.reset()
    steps = config.max_new_tokens
    with changes_left_out(left_out):
        sampler = generation.CompiledSampler(MAX_PROMPT, log=lambda line: None)
        started = time.perf_counter()
        sampler.generate(model, ids, mask, config)
        synchronize(device)
        compile_s = time.perf_counter() - started
        rounds = []
        for _ in range(TIMED_ROUNDS):
            started = time.perf_counter()
            sampler.generate(model, ids, mask, config)
            synchronize(device)
            rounds.append(time.perf_counter() - started)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            sampler.generate(model, ids, mask, config)
            synchronize(device)
        with device_reads() as reads:
            sampler.generate(model, ids, mask, config)
    if sampler.compiles != 1:
        raise RuntimeError(f"expected one compile per arm, got {sampler.compiles}")
    events = prof.key_averages()
    wall = 1000 * statistics.median(rounds) / steps
    row = {
        "ms per decoding step": wall,
        "round s": statistics.median(rounds),
        "compile s": compile_s,
        "guard checks ms": per_step_ms(events, GUARDS, steps),
        "device reads": reads[0] / steps,
    }
    if device.type == "cuda":
        busy = gpu_busy_ms(events, steps)
        row |= {
            "graph launch ms": per_step_ms(events, GRAPH_LAUNCH, steps),
            "waiting on GPU ms": per_step_ms(events, WAITS, steps),
            "GPU busy ms": busy,
            "GPU idle %": 100 * max(0.0, 1 - busy / wall),
        }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the seed's module structure at width 96, on CPU")
    parser.add_argument(
        "--arms",
        type=lambda value: value.split(","),
        default=list(ARMS),
        help=f"comma-separated arms (default all: {', '.join(ARMS)})",
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        help=f"decoding steps a round (default {MAX_COMPLETION}; {TINY_COMPLETION} with --tiny)",
    )
    args = parser.parse_args()
    quiet_libraries()
    unknown = [arm for arm in args.arms if arm not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown {', '.join(unknown)}; expected some of {', '.join(ARMS)}")
    new_tokens = args.new_tokens or (TINY_COMPLETION if args.tiny else MAX_COMPLETION)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu":
        torch.set_num_threads(1)  # the host-side figures are single-threaded Python either way

    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            path = build_tiny_seed_structure(Path(tmp) / "model")
        else:
            path = build_random_qwen(Path(tmp) / "model")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = lora_model(path, device)
    problems = load_problems(str(BUNDLED_PROBLEMS))[:BATCH]
    ids, mask = prompt_batch(tokenizer, [p for p in problems for _ in range(GENERATIONS)])
    ids, mask = ids.to(device), mask.to(device)
    # Every completion runs to the limit (no end token), as a random model's do: the same steps per arm.
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=True,
        temperature=0.9,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=None,
    )

    rows = {arm: measure_arm(model, ids, mask, config, ARMS[arm]) for arm in args.arms}
    what = "tiny model of the seed's structure (--tiny)" if args.tiny else "random Qwen2.5-Coder-1.5B"
    print(
        f"\n{device_name()}; {what}; {ids.shape[0]} sequences x {MAX_PROMPT + new_tokens} cache positions, "
        f"{new_tokens} decoding steps a round; median of {TIMED_ROUNDS} rounds after the compile; the "
        "breakdown from one profiled round (ms per decoding step), device reads per decoding step"
    )
    columns = list(next(iter(rows.values())))
    print("\n| arm | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for arm, row in rows.items():
        print(f"| {arm} | " + " | ".join(f"{row[c]:.3g}" for c in columns) + " |")
    first, last = rows[args.arms[0]], rows[args.arms[-1]]
    speedup = first["ms per decoding step"] / last["ms per decoding step"]
    guards = first["guard checks ms"] / max(last["guard checks ms"], 1e-9)
    print(
        f"\n{args.arms[-1]} vs {args.arms[0]}: {speedup:.2f}x per decoding step; guards {guards:.1f}x lower"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
