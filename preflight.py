"""`python train.py --check` (`make check`): proves a box in about two minutes before a run downloads weights
and compiles, with the settings the run would use (.envrc, env, flags).

One line per check, `ok`, `FAIL` or `skip`, with the figure or the fix; the exit status is 1 when a check
failed, else 0. No model weights are loaded: the model's config is read (from the hub or its folder), and
the sampler is tried on a small random model of the same architecture with the run's LoRA. The checks:

- the OCaml toolchain and its versions; bubblewrap's sandbox runs and refuses a write outside its folder;
  the reward scores the worked (few-shot) example 1.0 in the run's sandbox;
- TRAINING_DATASET and GRPO_EVAL_DATASET load: usable problems, rows dropped and why, problems whose tests
  do not compile (problem_check.py), prompts over GRPO_MAX_PROMPT (with the model's tokenizer);
- the device as torch sees it: the card, its memory, bf16 (on the CPU the GPU checks are `skip`);
- the model's config: parameters, memory estimates for sampling and for the update with and without
  gradient checkpointing against the device, what GRPO_GRADIENT_CHECKPOINTING and GRPO_GENERATION resolve to
  and why;
- the sampler on this device: TRL's plain sampling against the compiled sampler (generation.py) on the small
  model: log-probability agreement, compile time, ms per decoding step of each;
- the output folder is writable and holds no earlier run's checkpoints (unless --resume).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import cpu_training
from envflags import ConfigError
from settings import TrainConfig, round_rows

GiB = 2**30
SAMPLER_BATCH, SAMPLER_PROMPT, SAMPLER_TOKENS = 4, 24, 16


class Failed(Exception):
    """A check's FAIL line: what is wrong and the fix."""


class Skipped(Exception):
    """A check's skip line: why it does not apply here."""


@functools.cache
def _model_config_or_error(model_id: str):
    from models import load_config

    try:
        return load_config(model_id, "GRPO_MODEL_ID"), None
    except ConfigError as err:
        return None, err


def model_config(model_id: str):
    """The model's config, read once per check run: a model that cannot be reached costs the hub client's
    retries once, and its error is the model line's, not the sampler's too."""
    config, error = _model_config_or_error(model_id)
    if error is not None:
        raise error
    return config.__class__.from_dict(config.to_dict())  # a copy: small_model changes its widths


def gib(size: int) -> str:
    return f"{size / GiB:.1f}" if size >= GiB / 10 else f"{size / GiB:.2g}"


def first_line(err: BaseException) -> str:
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# ------------------------------------------------------------------------------------------------------------
# The reward's toolchain


def command_output(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise Failed(
            f"`{' '.join(argv)}` exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
        )
    return done.stdout.strip()


def check_toolchain(cfg: TrainConfig) -> str:
    from ocaml_sandbox import APT_INSTALL

    missing = [tool for tool in ("ocamlc", "ocamlfind", "bwrap") if shutil.which(tool) is None]
    if missing:
        raise Failed(f"{', '.join(missing)} not on PATH; install: {APT_INSTALL}")
    ocamlc = command_output(["ocamlc", "-version"])
    findlib = command_output(["ocamlfind", "query", "-format", "%v", "findlib"])
    bwrap = command_output(["bwrap", "--version"]).removeprefix("bubblewrap ")
    return f"ocamlc {ocamlc}, ocamlfind {findlib}, bubblewrap {bwrap}"


def check_sandbox(cfg: TrainConfig) -> str:
    """bubblewrap runs a program in the reward's sandbox, which can write its own folder and not the one
    above it (read-only inside, and a host folder outside)."""
    from ocaml_sandbox import bwrap_args

    if cfg.ocaml_sandbox == "rlimit":
        raise Skipped("OCAML_SANDBOX=rlimit: completions run under resource limits only, not sandboxed")
    with tempfile.TemporaryDirectory() as tmp:
        work, outside = Path(tmp) / "work", Path(tmp) / "outside.txt"
        work.mkdir()
        script = f"echo in > {work / 'inside.txt'} && echo out > {outside}"
        done = subprocess.run(
            [*bwrap_args(work, work), "/bin/sh", "-c", script], capture_output=True, text=True, timeout=30
        )
        if not (work / "inside.txt").is_file():
            fix = "OCAML_SANDBOX=rlimit runs without it (no isolation)"
            raise Failed(f"bubblewrap cannot start a sandbox here ({done.stderr.strip()[:200]}); {fix}")
        if outside.exists():
            raise Failed(f"a program in the sandbox wrote {outside}, outside its folder: do not train here")
    return "bubblewrap runs; a write outside the sandbox's folder is refused"


def check_reward(cfg: TrainConfig) -> str:
    from prompts import check_few_shot

    started = time.monotonic()
    try:
        check_few_shot(cfg)  # train.py's own refusal, in the run's sandbox
    except ConfigError as err:
        raise Failed(str(err)) from None
    return f"the worked example scores 1.0 in the sandbox ({time.monotonic() - started:.1f} s)"


# ------------------------------------------------------------------------------------------------------------
# Data


def check_dataset(
    cfg: TrainConfig, env: str, source: str, tokenizer, rows_needed: int, *, to_train: bool = True
) -> str:
    """Usable problems of one dataset, what was dropped and why, and prompts too long for GRPO_MAX_PROMPT;
    data to train on is refused where its licence forbids it (MultiPL-E)."""
    from problem_check import leave_out_broken
    from problems import load_problems
    from prompts import fitting_prompts
    from rewards import reference_program

    dropped: list[str] = []
    try:
        problems = load_problems(source, warn=dropped.append, setting_name=env, to_train=to_train)
    except ConfigError as err:
        raise Failed(str(err)) from None
    notes: list[str] = []
    problems, result = leave_out_broken(problems, cfg, reference_program, note=notes.append)
    if not problems:
        raise Failed(
            f"{env}={source!r}: no usable problem ({len(dropped)} rows dropped, {len(result.broken)} "
            "whose tests do not compile); `python rewards.py check` names each"
        )
    parts = [f"{len(problems)} usable problems"]
    if dropped:
        parts.append(f"{len(dropped)} rows dropped (first: {dropped[0]})")
    if result.broken:
        parts.append(
            f"{len(result.broken)} left out by the problem check (first: {' '.join(result.broken[0])})"
        )
    if tokenizer is not None:
        fitting = len(fitting_prompts(problems, tokenizer, cfg, source, lambda text: None))
        parts.append(f"{len(problems) - fitting} prompts over GRPO_MAX_PROMPT={cfg.max_prompt_length} tokens")
        if fitting < rows_needed:
            raise Failed(
                f"{env}={source!r}: {fitting} problems fit, one step takes {rows_needed}; lower "
                "GRPO_BATCH_SIZE or GRPO_GRAD_ACCUM_STEPS, or raise GRPO_MAX_PROMPT"
            )
    return f"{env}={source}: " + "; ".join(parts)


# ------------------------------------------------------------------------------------------------------------
# Device, model, sampler


def check_device() -> str:
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
        raise Skipped(f"no CUDA device for torch {torch.__version__} ({build}): the GPU checks are skipped")
    props = torch.cuda.get_device_properties(0)
    bf16 = (
        "bf16" if torch.cuda.is_bf16_supported() else "no bf16 (trains in float32: slower, twice the memory)"
    )
    return (
        f"{torch.cuda.device_count()} x {props.name}, {props.total_memory / GiB:.0f} GiB, compute capability "
        f"{props.major}.{props.minor}, {bf16}; torch {torch.__version__}, CUDA {torch.version.cuda}"
    )


def model_memory(cfg: TrainConfig) -> tuple[int, int, int, Callable[[int], int]]:
    """(parameters, weight bytes, bytes of the sampler's KV cache for one round, the estimated peak bytes of
    the update without checkpointing as a function of a pass's positions), from the model's config alone
    (meta device, nothing loaded)."""
    import torch

    import generation

    config = model_config(cfg.model_id)
    params, weights = generation.model_size(config)
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    rows = round_rows(cfg)
    positions = cfg.max_prompt_length + cfg.max_completion_length
    element = torch.finfo(config.dtype or torch.float32).bits // 8
    cache = 2 * text.num_hidden_layers * rows * positions * kv_heads * head_dim * element
    return params, weights, cache, functools.partial(generation.update_peak_bytes, config, weights)


def check_model(cfg: TrainConfig, sources: Mapping[str, str]) -> str:
    import torch

    import generation

    try:
        params, weights, cache, peak = model_memory(cfg)
    except ConfigError as err:  # in its own words: the hub unreachable, the way forward
        raise Failed(str(err)) from None
    except (OSError, ValueError) as err:
        raise Failed(f"GRPO_MODEL_ID={cfg.model_id!r}: cannot read its config ({first_line(err)})") from None
    layers = model_config(cfg.model_id).get_text_config().num_hidden_layers
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    memory = generation.device_memory(device)
    checkpointing, why, whole_groups = cpu_training.update_passes(cfg, 1, peak, memory)
    without = peak(cpu_training.update_pass_tokens(cfg, whole_groups))
    # With checkpointing only one layer's activations are held at a time, besides each layer's input; its
    # passes are TRL's (update_passes).
    copies = generation.WEIGHT_COPIES * weights
    with_checkpointing = copies + (peak(cpu_training.update_pass_tokens(cfg, False)) - copies) // layers
    rows = cfg.num_generations if whole_groups else cfg.per_device_train_batch_size
    where = "GPU" if device.type == "cuda" else "RAM"
    count = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.1f}M"
    return (
        f"{cfg.model_id}: {count} parameters, {gib(weights)} GiB of weights; estimated peak "
        f"{gib(weights + cache)} GiB sampling, update {gib(without)} GiB without gradient "
        f"checkpointing and {gib(with_checkpointing)} GiB with it, of {memory / GiB:.0f} GiB {where}; "
        f"checkpointing {'on' if checkpointing else 'off'} ({why}); update passes of {rows} completions"
        f"{' (a group each)' if whole_groups else ''}; sampling {cfg.generation} "
        f"({sources['generation_reason']})"
    )


def small_model(cfg: TrainConfig, device):
    """A random model of the configured architecture, two layers deep (and narrow on the CPU), bf16 where
    the run trains in bf16, with the run's LoRA given an effect."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = model_config(cfg.model_id)
    text = config.get_text_config()
    text.num_hidden_layers = min(2, text.num_hidden_layers)
    if device.type == "cpu" and text.hidden_size > 256:  # the CPU checks that it works, not its speed
        text.update({"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "head_dim": 32})
        text.update({"num_key_value_heads": min(getattr(text, "num_key_value_heads", 4) or 4, 4)})
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[: text.num_hidden_layers]
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if bf16 else torch.float32)
    targets = [name.strip() for name in cfg.lora_target_modules.split(",")]
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.01)
    return model.eval()


def forward_logprobs(model, ids, completion, temperature: float):
    """Per-token log-probabilities of `completion` after `ids` in one forward pass, as TRL's trainer
    computes them (logits over the temperature)."""
    import torch

    logits = model(input_ids=torch.cat([ids, completion], 1)).logits[:, ids.shape[1] - 1 : -1].float()
    return (logits / temperature).log_softmax(-1).gather(2, completion.unsqueeze(2)).squeeze(2)


def timed_ms_per_step(call: Callable[[], object], steps: int, device) -> float:
    import torch

    started = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - started) / steps


def check_sampler(cfg: TrainConfig) -> str:
    """TRL's plain sampling and the compiled sampler on the small model: the sampler's log-probabilities
    of plain's completions against the forward pass TRL trains with, the compile, ms per decoding step."""
    import torch
    from transformers import GenerationConfig

    import generation

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if _model_config_or_error(cfg.model_id)[1] is not None:
        raise Skipped("needs the model's config (the model line says why it cannot be read)")
    try:
        model = small_model(cfg, device)
    except (OSError, ValueError, KeyError) as err:
        raise Failed(
            f"GRPO_MODEL_ID={cfg.model_id!r}: no small model of its architecture ({first_line(err)})"
        ) from None
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (SAMPLER_BATCH, SAMPLER_PROMPT), generator=generator).to(device)
    mask = torch.ones_like(ids)
    # No end token: every completion runs SAMPLER_TOKENS steps, the same for both paths.
    config = GenerationConfig(
        do_sample=True,
        temperature=cfg.temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=SAMPLER_TOKENS,
        pad_token_id=0,
        eos_token_id=None,
        disable_compile=True,
    )
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, generation_config=config)  # a warm-up
        plain_ms = timed_ms_per_step(
            lambda: model.generate(input_ids=ids, attention_mask=mask, generation_config=config),
            SAMPLER_TOKENS,
            device,
        )
        completion = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[
            :, ids.shape[1] :
        ]
        trained = forward_logprobs(model, ids, completion, cfg.temperature)
        with model.disable_adapter():
            base = forward_logprobs(model, ids, completion, cfg.temperature)
    lines: list[str] = []
    sampler = generation.CompiledSampler(SAMPLER_PROMPT, log=lines.append)
    started = time.perf_counter()
    try:
        sampled = sampler.token_logprobs(model, ids, mask, completion, config)
    except ConfigError as err:
        raise Failed(f"{err}".removeprefix("GRPO_GENERATION=compiled: ")) from None
    compile_s = time.perf_counter() - started
    compiled_ms = timed_ms_per_step(
        lambda: sampler.generate(model, ids, mask, config), SAMPLER_TOKENS, device
    )
    gap, effect = (sampled - trained).abs().mean().item(), (trained - base).abs().mean().item()
    backend = (
        "inductor"
        if device.type == "cuda"
        else f"dynamo with the {generation.CPU_BACKEND} backend on the CPU"
    )
    figures = (
        f"mean |log-prob difference| {gap:.1e} over {completion.numel()} tokens (the LoRA's effect: "
        f"{effect:.1e}); compile {compile_s:.1f} s "
        f"({backend}); ms per decoding step: plain {plain_ms:.1f}, compiled {compiled_ms:.1f}"
    )
    if gap > effect / 10:  # bf16's rounding noise is far below that; a sampler without the LoRA is not
        raise Failed(
            f"the compiled sampler disagrees with the trainer's forward: {figures}; set GRPO_GENERATION=plain"
        )
    return (
        f"compiled against plain on a 2-layer random {model.config.model_type} with the run's LoRA: {figures}"
    )


def check_output_dir(cfg: TrainConfig, resume: bool) -> str:
    from run_records import resume_point

    out = Path(cfg.output_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            pass
    except OSError as err:
        raise Failed(f"GRPO_OUTPUT_DIR={cfg.output_dir!r} is not writable ({first_line(err)})") from None
    try:
        last = resume_point(cfg.output_dir, resume)  # what train.py refuses, in its words
    except ConfigError as err:
        raise Failed(str(err)) from None
    if last is not None:
        return f"{out}: writable; --resume continues from {last.name}"
    return f"{out}: writable, no earlier run's checkpoints"


# ------------------------------------------------------------------------------------------------------------


def checks(
    cfg: TrainConfig, sources: Mapping[str, str], resume: bool
) -> Iterator[tuple[str, Callable[[], str]]]:
    """(name, check) in the order a user fixes things; a check returns its figure or raises Failed/Skipped."""
    yield "toolchain", lambda: check_toolchain(cfg)
    yield "sandbox", lambda: check_sandbox(cfg)
    yield "reward", lambda: check_reward(cfg)
    from models import load_tokenizer

    tokenizer = None
    try:
        tokenizer = load_tokenizer(cfg.model_id, "GRPO_MODEL_ID")
    except ConfigError as err:
        message = str(err)

        def no_tokenizer() -> str:
            raise Failed(message)

        yield "tokenizer", no_tokenizer
    prompts_per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    yield (
        "training data",
        lambda: check_dataset(cfg, "TRAINING_DATASET", cfg.training_dataset, tokenizer, prompts_per_step),
    )
    if cfg.eval_steps is not None and cfg.eval_dataset:
        from problems import bundled_path

        source = bundled_path(cfg.eval_dataset)
        yield (
            "held-out data",
            lambda: check_dataset(cfg, "GRPO_EVAL_DATASET", source, tokenizer, 1, to_train=False),
        )
    yield "device", check_device
    yield "model", lambda: check_model(cfg, sources)
    yield "sampler", lambda: check_sampler(cfg)
    yield "output", lambda: check_output_dir(cfg, resume)


def run(
    cfg: TrainConfig,
    sources: Mapping[str, str],
    *,
    resume: bool = False,
    write: Callable[[str], None] = print,
) -> int:
    """Every check, one line each as it finishes; 0 when none failed, else 1."""
    from huggingface_hub.utils import logging as hub_logging

    from run_records import quiet_libraries

    quiet_libraries()
    hub_logging.set_verbosity_error()  # one line per check: the hub client's retries are not ours to print
    started, failed = time.monotonic(), 0
    for name, check in checks(cfg, sources, resume):
        try:
            line = f"ok    {name}: {check()}"
        except Skipped as why:
            line = f"skip  {name}: {why}"
        except Failed as why:
            line, failed = f"FAIL  {name}: {why}", failed + 1
        except Exception as err:  # a check that breaks is a failure of this box, not of the preflight
            last = traceback.extract_tb(err.__traceback__)[-1]
            line = f"FAIL  {name}: {first_line(err)} (at {Path(last.filename).name}:{last.lineno})"
            failed += 1
        write(line)
    verdict = f"{failed} check(s) failed" if failed else "all checks passed"
    write(f"{verdict} in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0
