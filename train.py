"""GRPO + LoRA training of a causal LM on OCaml problems, rewarded by the real OCaml toolchain.

    python train.py                      # GRPO; settings from flags > env (.envrc) > defaults
    python train.py --sft                # the supervised warm start on reference solutions
    python train.py --check              # the preflight of a new box, in about two minutes
    python train.py --print-config       # the resolved settings as JSON, nothing loaded
    python train.py --demo               # tiny local model, SFT then GRPO on the CPU, about 2 min

This file is the run, top to bottom: the settings (settings.py's TrainConfig, resolved from flags and env),
then the GRPO run (problems -> prompts -> TRL's GRPOTrainer with a PEFT LoRA adapter -> rewards.py's OCaml
reward -> learning.log, metrics.jsonl, the health monitor, held-out evaluations, the model card), then the SFT
run on TRL's SFTTrainer. docs/architecture.md says which module holds each step. Torch, transformers, TRL and
PEFT are imported only after every setting has been checked, so a bad value stops in well under a second and
never after the model has loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import cpu_training
import dashboard
import demo
import envflags
from demo import DEMO_SETTINGS
from envflags import ConfigError
from evaluate import held_out_evaluation, split_held_out
from models import is_gguf, load_causal_lm, load_tokenizer
from ocaml_sandbox import check_toolchain
from problem_check import leave_out_broken
from problems import load_problems
from prompts import build_sft_dataset, build_train_dataset, check_few_shot, fitting_prompts
from reward_control import ShuffledReward
from rewards import SyntaxAwareReward, reference_program
from run_records import (
    append_log_line,
    console,
    exit_status,
    format_eval_line,
    format_log_line,
    format_sft_line,
    model_card,
    model_card_callback,
    quiet_libraries,
    read_jsonl,
    resume_point,
    use_step_lines,
    write_header,
)
from settings import TrainConfig, check_paths, generation_choice, round_rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="GRPO + LoRA training of a code model on OCaml, rewarded by the OCaml toolchain.",
        epilog="Every setting resolves as flag > env variable > default.",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved settings as JSON and exit"
    )
    parser.add_argument(
        "--config-table", action="store_true", help="print docs/configuration.md's settings table and exit"
    )
    parser.add_argument(
        "--sft",
        action="store_true",
        help="supervised warm start on the problems' reference solutions (SFT_* settings) instead of GRPO",
    )
    parser.add_argument("--demo", action="store_true", help="offline run of a tiny local model on the CPU")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in the output dir"
    )
    parser.add_argument(
        "--check", action="store_true", help="check this box and the settings in about two minutes, then exit"
    )
    parser.add_argument(
        "--merge-to", metavar="DIR", help="after training, write base model + adapter merged to DIR"
    )
    envflags.add_arguments(parser, TrainConfig)
    return parser


def parse_config(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None, *, demo: bool = False
) -> tuple[TrainConfig, dict[str, str]]:
    """Settings from flags > env > defaults (the demo's settings stand in for env), and where each came from;
    that map also holds `generation_reason`, why GRPO_GENERATION resolved as it did. Raises ConfigError."""
    args, _ = build_parser().parse_known_args(argv)
    environ = dict(os.environ if environ is None else environ)
    if "GRPO_USE_VLLM" in environ:  # an .envrc from before GRPO_GENERATION
        raise ConfigError(
            f"GRPO_USE_VLLM={environ['GRPO_USE_VLLM']!r}: replaced by GRPO_GENERATION; write "
            "GRPO_GENERATION=vllm to sample with vLLM, or remove the line (auto samples without it)"
        )
    if demo:
        environ.update(DEMO_SETTINGS)
    cfg, sources = envflags.resolve(TrainConfig, args, environ)
    if demo:
        demo_fields = {
            f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("env") in DEMO_SETTINGS
        }
        sources = {k: "demo" if k in demo_fields and v != "flag" else v for k, v in sources.items()}
        if sources["model_id"] != "flag":  # run_demo builds it there
            cfg = dataclasses.replace(cfg, model_id=str(Path(cfg.output_dir) / "tiny-model"))
            sources["model_id"] = "demo"
    check_paths(cfg, sources)  # before auto's sampler, which imports torch where a GPU shows: no error does
    # Resolved here, so that --print-config and learning.log's header show what auto became (and --check
    # why); the source "auto" tells the compiled sampler that a failed compile may fall back to plain
    # sampling. A refused explicit `compiled` stops here.
    generation, sources["generation_reason"] = generation_choice(cfg.generation, environ)
    if cfg.generation == "auto":
        cfg = dataclasses.replace(cfg, generation=generation)
        sources["generation"] = "auto"
    return cfg, sources


# ------------------------------------------------------------------------------------------------------------
# Training


def grpo_args(cfg: TrainConfig, use_bf16: bool):
    import torch
    from trl import GRPOConfig

    # The seed's step: GRPO_BATCH_SIZE prompts x GRPO_NUM_GENERATIONS completions, sampled in one round
    # (TRL needs a round to hold whole groups) and trained in passes of GRPO_BATCH_SIZE completions. TRL
    # samples a round every gradient_accumulation_steps passes, so every optimizer step gets fresh rewards
    # and any batch works with any group size. Each setting is passed by its TRL name, one line each, so that
    # the list reads against TRL's GRPOConfig (a loop over names would hide which ones are passed).
    return GRPOConfig(
        output_dir=cfg.output_dir,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps * cfg.num_generations,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps or -1,
        learning_rate=cfg.learning_rate,
        temperature=cfg.temperature,
        max_grad_norm=cfg.max_grad_norm,
        logging_steps=cfg.logging_steps,
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        epsilon_high=cfg.epsilon_high,
        mask_truncated_completions=cfg.mask_truncated_completions,
        top_entropy_quantile=cfg.top_entropy_quantile,
        scale_rewards=cfg.scale_rewards,
        report_to=cfg.report_to,
        use_vllm=cfg.generation == "vllm",
        vllm_mode=cfg.vllm_mode,
        # transformers 5's name for gradient_checkpointing (GRPOConfig sets both). auto starts as TRL's
        # default, on; train() settles it once the model and the device are known.
        activation_checkpointing=cfg.gradient_checkpointing != "off",
        bf16=use_bf16,
        use_cpu=use_bf16 and cpu_training.on_cpu(),  # transformers allows bf16 on the CPU only when told
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning is for copies to a GPU
        # Every LoRA weight takes part in every forward pass; transformers would otherwise have DDP search for
        # unused ones whenever checkpointing is off (and torch warn that it found none).
        ddp_find_unused_parameters=False,
        seed=cfg.seed,
        # Load the weights in the dtype they were saved in (bf16 for Qwen2.5) rather than TRL's float32:
        # half the memory, and generation, which runs outside autocast, at bf16 speed. A model train.py
        # loads itself (policy_model) is loaded the same way.
        model_init_kwargs=None if loads_policy_itself(cfg) else {"dtype": "auto"},
    )


def print_nothing(text: str) -> None:
    """What processes other than the main one do with log lines and notes."""


def loads_policy_itself(cfg: TrainConfig) -> bool:
    """Whether train.py loads the model rather than TRL: a GGUF file, or a base for GRPO_INIT_ADAPTER."""
    return bool(cfg.init_adapter) or is_gguf(cfg.model_id)


def policy_model(cfg: TrainConfig):
    """What the trainer gets as its model: the id, which TRL loads, or the model loaded here: a GGUF file
    dequantized (models.py), with GRPO_INIT_ADAPTER's trainable LoRA adapter (say, --sft's) where set."""
    if not loads_policy_itself(cfg):
        return cfg.model_id
    import torch
    from peft import PeftModel

    torch.manual_seed(cfg.seed)
    base = load_causal_lm(cfg.model_id)
    return PeftModel.from_pretrained(base, cfg.init_adapter, is_trainable=True) if cfg.init_adapter else base


def lora_config(cfg: TrainConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        bias=cfg.lora_bias,
        target_modules=[name.strip() for name in cfg.lora_target_modules.split(",")],
        task_type="CAUSAL_LM",
    )


def train(
    cfg: TrainConfig, sources: Mapping[str, str], *, resume: bool = False, merge_to: str | None = None
) -> Path:
    """Run GRPO and return the adapter folder; whatever can be refused is refused before the model loads."""
    output_dir = Path(cfg.output_dir)
    resume_from = resume_point(cfg.output_dir, resume)
    check_toolchain()
    check_few_shot(cfg)
    tracking = dashboard.keep_local(cfg)  # before TRL imports trackio, which reads its folder once

    import generation
    from dynamic_sampling import DynamicSamplingTrainer, describe
    from health_bands import PROFILES
    from monitor import HealthMonitor, SkipNonFiniteUpdates

    quiet_libraries()
    # GRPOConfig sets up the distributed state, so it comes before anything that asks for the main process.
    use_bf16 = cpu_training.model_bf16_autocast(cfg.model_id)
    args = grpo_args(cfg, use_bf16=use_bf16)
    is_main = args.process_index == 0
    log_path, metrics_path = output_dir / "learning.log", output_dir / "metrics.jsonl"
    output_dir.mkdir(parents=True, exist_ok=True)
    write_line = (lambda text: (append_log_line(log_path, text), console(text))) if is_main else print_nothing
    note = (
        (lambda text: (console(text), append_log_line(log_path, f"# {text}"))) if is_main else print_nothing
    )
    if is_main:
        write_header(log_path, cfg, sources, resume_from.name if resume_from else None)
    note(
        f"launch: distributed type: {args.distributed_state.distributed_type.value}, "
        f"processes: {args.world_size}, device: {args.device}"
    )
    if tracking:
        note(tracking)
    if cpu_training.on_cpu():
        cpu_training.use_free_cores(note)

    problems = load_problems(cfg.training_dataset, warn=note, to_train=True)
    # The main process checks the training and held-out problems first; the others read its cached verdicts.
    with args.main_process_first(desc="problem check"):
        problems, _ = leave_out_broken(problems, cfg, reference_program, note, what="TRAINING_DATASET")
        problems, held_out = split_held_out(problems, cfg, note)
    tokenizer = load_tokenizer(cfg.model_id, "GRPO_MODEL_ID")
    dataset = build_train_dataset(problems, tokenizer, cfg, note)
    if held_out:  # over-long prompts dropped as training drops them: evaluation keeps the training shape
        held_out = [p for p, _ in fitting_prompts(held_out, tokenizer, cfg, "the held-out set", note)]
    prompts_per_round = args.generation_batch_size // cfg.num_generations
    if len(dataset) < prompts_per_round:
        raise ConfigError(
            f"TRAINING_DATASET={cfg.training_dataset!r}: {len(dataset)} usable problems, but one generation "
            f"step takes {prompts_per_round}; lower GRPO_BATCH_SIZE or GRPO_GRAD_ACCUM_STEPS"
        )

    checkpointing, why, whole_groups = cpu_training.update_passes(
        cfg,
        args.world_size,
        lambda tokens: generation.model_update_peak_bytes(cfg.model_id, tokens),
        memory_bytes=generation.device_memory(args.device),
    )
    # Settled before TRL reads it; transformers 5 calls it activation_checkpointing, GRPOConfig has both.
    args.gradient_checkpointing = args.activation_checkpointing = checkpointing
    if whole_groups:
        cpu_training.group_per_pass(args, cfg.num_generations)
    note(
        f"sampling: {cfg.generation}; gradient checkpointing: {'on' if checkpointing else 'off'} ({why}); "
        f"update: passes of {args.per_device_train_batch_size} completions"
        + (" (a group each, its prompt run once)" if whole_groups else "")
    )
    if cfg.init_adapter:
        note(f"GRPO continues to train the adapter {cfg.init_adapter} on {cfg.model_id}")
    policy = policy_model(cfg)
    adapter_dir = output_dir / "adapter"
    card = lambda: model_card(cfg, sources, metrics_path, adapter_dir)
    reward = SyntaxAwareReward(
        cfg,
        log_dir=output_dir / "reward_logs",
        max_completion_length=cfg.max_completion_length,
        completion_columns=tracking is not None,  # with the dashboard (GRPO_REPORT_TO=trackio) only
    )
    if cfg.reward_control == "shuffled":
        note(
            "GRPO_REWARD_CONTROL=shuffled: a control run, trained on each step's rewards permuted across its "
            "completions; every log keeps the real rewards"
        )
    lines = board = None
    try:
        trainer = DynamicSamplingTrainer(  # TRL's GRPOTrainer itself with GRPO_DYNAMIC_SAMPLING=off
            model=policy,
            reward_funcs=[ShuffledReward(reward, cfg.seed) if cfg.reward_control == "shuffled" else reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=None if cfg.init_adapter else lora_config(cfg),
            dynamic_sampling=cfg.dynamic_sampling,
            max_rounds=cfg.dynamic_max_rounds,
            note=note,
        )
        if cfg.dynamic_sampling != "off":
            note(describe(cfg.dynamic_max_rounds, prompts_per_round))
        if cfg.generation == "compiled":  # a round's rows per process: evaluation batches padded to it
            asked = "auto" if sources["generation"] == "auto" else "compiled"  # auto may fall back to plain
            sampler = generation.CompiledSampler(
                cfg.max_prompt_length, round_rows(cfg), asked=asked, log=note, warn=write_line
            )
            sampler.install(trainer.model)
        elif use_bf16 and cpu_training.on_cpu():  # sampling multiplies the LoRA in bf16, as the update does
            generation.PlainSampler().install(trainer.model)
        # The step line first, then the monitor's WARNING/OK lines about it, then an evaluation's line.
        lines = use_step_lines(
            trainer, log_path, metrics_path, lambda logs: format_log_line(logs, reward.__name__)
        )
        # On --resume the monitor starts from what was logged up to the checkpoint (it cuts at the step).
        board = dashboard.install(trainer, output_dir.name, dataclasses.asdict(cfg), reward.__name__)
        health = HealthMonitor(
            write_line,
            cfg.stop_on_red_flags,
            earlier=read_jsonl(metrics_path) if resume_from else [],
            alert=board.alert if board else None,
            profile=PROFILES[cfg.monitor_bands],
        )
        trainer.add_callback(health)
        trainer.add_callback(SkipNonFiniteUpdates(write_line))
        if held_out:

            def record(row: dict) -> None:
                append_log_line(metrics_path, json.dumps(row))
                write_line(format_eval_line(row))
                health.add_eval(row)  # the memorising WARNING/OK about it
                if board:
                    board.add_eval(row)

            trainer.add_callback(held_out_evaluation(held_out, tokenizer, cfg, record))
        trainer.add_callback(model_card_callback(output_dir, card))
        with cpu_training.fast_kernels(trainer.model, use_bf16):
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        trainer.save_model(str(adapter_dir))
    finally:  # also when an error stops the run: no bar left half drawn, no trackio run left open
        if lines:
            lines.close_bar()
        if board:  # None unless GRPO_REPORT_TO=trackio
            board.finish()
        reward.close()
    if is_main:
        for folder in (output_dir, adapter_dir):
            (folder / "README.md").write_text(card(), encoding="utf-8")
    note(f"adapter (PEFT format) saved to {adapter_dir}")
    if merge_to and is_main:
        merge_adapter(cfg.model_id, adapter_dir, Path(merge_to))
        note(f"merged model saved to {merge_to}")
    return adapter_dir


def merge_adapter(model_id: str, adapter_dir: Path, out_dir: Path) -> None:
    """Base model + LoRA adapter folded into one model, loaded afresh so that it works after any launcher."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    merged = PeftModel.from_pretrained(load_causal_lm(model_id), str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(out_dir)


def sft_validation_split(
    problems: list[dict], cfg: TrainConfig, note: Callable[[str], None]
) -> tuple[list[dict], list[dict]]:
    """(problems to train on, SFT_VALIDATION problems kept out to choose the epoch), drawn by GRPO_SEED."""
    if not cfg.sft_validation:
        return problems, []
    if cfg.sft_validation >= len(problems):
        raise ConfigError(f"SFT_VALIDATION={cfg.sft_validation}: the SFT data has {len(problems)} problems")
    shuffled = random.Random(cfg.seed).sample(problems, len(problems))
    note(f"sft: {cfg.sft_validation} of {len(problems)} problems kept out as the validation split")
    return shuffled[cfg.sft_validation :], shuffled[: cfg.sft_validation]


def sft_trainer(cfg: TrainConfig, note: Callable[[str], None]):
    """TRL's SFTTrainer on GRPO's chat prompt and the reference answers, with the loss on the answer tokens
    only (TRL's completion-only loss for prompt-completion rows), writing into GRPO_OUTPUT_DIR/sft/."""
    import torch
    from trl import SFTConfig, SFTTrainer

    import generation

    # The data first: what cannot be trained on is refused before the model's config is read.
    source = cfg.sft_dataset or cfg.training_dataset
    setting_name = "SFT_DATASET" if cfg.sft_dataset else "TRAINING_DATASET"
    problems = load_problems(source, warn=note, for_sft=True, setting_name=setting_name, to_train=True)
    problems, _ = leave_out_broken(problems, cfg, reference_program, note, solutions=False, what=setting_name)
    problems, validation = sft_validation_split(problems, cfg, note)
    tokens = cfg.sft_batch_size * (cfg.max_prompt_length + cfg.max_completion_length)
    checkpointing, _ = generation.gradient_checkpointing(
        cfg.gradient_checkpointing,
        lambda: generation.model_update_peak_bytes(cfg.model_id, tokens),
        memory_bytes=generation.device_memory(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
    )
    args = SFTConfig(
        output_dir=str(Path(cfg.output_dir) / "sft"),
        num_train_epochs=cfg.sft_num_epochs,
        max_steps=cfg.sft_max_steps or -1,
        learning_rate=cfg.sft_learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,
        per_device_train_batch_size=cfg.sft_batch_size,
        max_length=cfg.max_prompt_length + cfg.max_completion_length,
        completion_only_loss=True,
        logging_steps=cfg.logging_steps,
        # With a validation split the run is evaluated and saved twice an epoch (at least twice in all: a
        # one-epoch run has a choice too), and the best point is loaded at the end.
        eval_strategy="steps" if validation else "no",
        save_strategy="steps" if validation else "no",
        eval_steps=(checkpoints := min(0.5, 1 / (2 * cfg.sft_num_epochs))),  # a share of the run's steps
        save_steps=checkpoints,
        load_best_model_at_end=bool(validation),
        metric_for_best_model="eval_loss",
        per_device_eval_batch_size=cfg.sft_batch_size,
        report_to=cfg.report_to,
        seed=cfg.seed,
        bf16=(use_bf16 := cpu_training.model_bf16_autocast(cfg.model_id)),
        use_cpu=use_bf16 and cpu_training.on_cpu(),
        activation_checkpointing=checkpointing,
        dataloader_pin_memory=torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
        model_init_kwargs=None if is_gguf(cfg.model_id) else {"dtype": "auto"},
    )
    tokenizer = load_tokenizer(cfg.model_id, "GRPO_MODEL_ID")
    return SFTTrainer(
        model=load_causal_lm(cfg.model_id) if is_gguf(cfg.model_id) else cfg.model_id,
        args=args,
        train_dataset=build_sft_dataset(problems, tokenizer, cfg, note),
        eval_dataset=build_sft_dataset(validation, tokenizer, cfg, note) if validation else None,
        processing_class=tokenizer,
        peft_config=None if cfg.sft_all_weights else lora_config(cfg),
    )


def sft(cfg: TrainConfig, sources: Mapping[str, str]) -> Path:
    """The supervised warm start (--sft). Returns GRPO_OUTPUT_DIR/sft/adapter (for GRPO_INIT_ADAPTER), or
    sft/model with SFT_ALL_WEIGHTS (for GRPO_MODEL_ID); per-step loss and token accuracy go to
    sft/learning.log and sft/metrics.jsonl."""
    out = Path(cfg.output_dir) / "sft"
    final = out / ("model" if cfg.sft_all_weights else "adapter")
    if final.exists():
        raise ConfigError(
            f"GRPO_OUTPUT_DIR={cfg.output_dir!r} already holds {final}: move it, or choose another"
        )
    quiet_libraries()
    from accelerate import PartialState

    is_main = PartialState().is_main_process
    out.mkdir(parents=True, exist_ok=True)
    log_path, metrics_path = out / "learning.log", out / "metrics.jsonl"
    note = (
        (lambda text: (console(text), append_log_line(log_path, f"# {text}"))) if is_main else print_nothing
    )
    if is_main:
        write_header(log_path, cfg, sources, None, program="train.py --sft")
    if tracking := dashboard.keep_local(cfg):  # before TRL imports trackio
        note(tracking)
    if cpu_training.on_cpu():
        cpu_training.use_free_cores(note)
    trainer = sft_trainer(cfg, note)
    board = dashboard.install(trainer, f"{Path(cfg.output_dir).name}-sft", dataclasses.asdict(cfg))
    use_step_lines(trainer, log_path, metrics_path, format_sft_line, console_lines=20)
    with cpu_training.fast_kernels(trainer.model, trainer.args.bf16):
        trainer.train()
    if board:
        board.finish()
    trainer.save_model(str(final))
    if is_main:
        (final / "README.md").write_text(
            model_card(cfg, sources, metrics_path, final, sft=True), encoding="utf-8"
        )
    if cfg.sft_all_weights:
        note(f"SFT model saved to {final}; start GRPO from it with --model-id {final}")
    else:
        note(f"SFT adapter saved to {final}; start GRPO from it with --init-adapter {final}")
    return final


def run_demo(cfg: TrainConfig, sources: dict[str, str], args: argparse.Namespace) -> None:
    """The whole pipeline on the CPU: a tiny model, its SFT warm start, GRPO with held-out evaluation, and
    the run report."""
    started = time.monotonic()
    quiet_libraries()
    demo.prepare(cfg, sources, resume=args.resume)
    if sources["model_id"] == "demo":  # the tiny model, then SFT of every weight, then GRPO from there
        sft_model = Path(cfg.output_dir) / "sft" / "model"
        if not (sft_model / "config.json").is_file():
            sft(dataclasses.replace(cfg, sft_all_weights=True), sources)
        cfg = dataclasses.replace(cfg, model_id=str(sft_model))
    adapter_dir = train(cfg, sources, resume=args.resume, merge_to=args.merge_to)
    demo.print_summary(
        Path(cfg.output_dir), adapter_dir, cfg.monitor_bands, seconds=time.monotonic() - started
    )


def run_command(args: argparse.Namespace, argv: list[str] | None, environ: Mapping[str, str] | None) -> int:
    """What the command line asks for, run; its exit status."""
    cfg, sources = parse_config(argv, environ, demo=args.demo)
    if args.print_config:
        resolved = {k: {"value": v, "source": sources[k]} for k, v in dataclasses.asdict(cfg).items()}
        print(json.dumps(resolved, indent=2))
        return 0
    if args.check:  # the preflight (preflight.py): one ok/FAIL/skip line per check
        import preflight

        return preflight.run(cfg, sources, resume=args.resume)
    if args.demo:
        run_demo(cfg, sources, args)
    elif args.sft:
        sft(cfg, sources)
    else:
        train(cfg, sources, resume=args.resume, merge_to=args.merge_to)
    end_processes()
    return 0


def end_processes() -> None:
    """The process group of `accelerate launch`, torn down while the run still owns it: left to the
    interpreter's exit, a finished run's process can abort (SIGABRT, "terminate called without an active
    exception") and fail the launch."""
    from accelerate import PartialState

    PartialState().destroy_process_group()


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.config_table:
        print(envflags.markdown_table(TrainConfig))
        return 0
    return exit_status(lambda: run_command(args, argv, environ))


if __name__ == "__main__":
    sys.exit(main())
