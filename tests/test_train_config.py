"""train.py settings: precedence, the seed's combination, one-line errors before any heavy import, docs."""

import json
import os
import re
import subprocess
import sys

import pytest

import cpu_training
import envflags
import settings
from conftest import run_train_py
from problems import ROOT
from settings import TrainConfig
from train import build_parser, grpo_args, main, parse_config

CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"  # holds the generated settings table


def test_flag_beats_env_beats_default() -> None:
    cfg, sources = parse_config(
        ["--temperature", "1.3", "--lora-r", "16"], {"GRPO_TEMPERATURE": "1.1", "GRPO_NUM_GENERATIONS": "8"}
    )
    assert (cfg.temperature, sources["temperature"]) == (1.3, "flag")
    assert (cfg.lora_r, sources["lora_r"]) == (16, "flag")
    assert (cfg.num_generations, sources["num_generations"]) == (8, "env")
    assert (cfg.learning_rate, sources["learning_rate"]) == (5e-6, "default")


def test_defaults_are_the_seeds() -> None:
    cfg, _ = parse_config([], {})
    assert cfg.model_id == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert cfg.training_dataset == "kiranpg/ocaml-training-problems"
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (4, 1)
    assert cfg.num_generations == 6
    assert (cfg.max_prompt_length, cfg.max_completion_length, cfg.num_train_epochs) == (704, 512, 1.0)
    assert (cfg.learning_rate, cfg.temperature, cfg.max_grad_norm, cfg.logging_steps) == (5e-6, 0.9, 1.0, 1)
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_bias) == (32, 64, 0.05, "none")
    assert cfg.lora_target_modules.split(",") == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    assert (cfg.min_non_empty_lines, cfg.runaway_penalty_multiplier) == (8, 0.3)
    assert cfg.output_dir == "grpo_runs" and cfg.report_to == "trackio" and cfg.trackio_dir is None


def test_seed_batch_of_4_with_6_generations_is_one_round_per_step() -> None:
    cfg, _ = parse_config([], {})
    args = grpo_args(cfg, use_bf16=False)
    # 4 prompts x 6 completions sampled once per optimizer step, trained in passes of 4 completions.
    assert args.per_device_train_batch_size == 4 and args.num_generations == 6
    assert args.generation_batch_size == 4 * 6
    assert args.gradient_accumulation_steps == args.steps_per_generation == 6


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [(2, 0.3, 2), (2, 0.6, 1), (2, 1.4, 1), (2, 7.6, 1), (16, 3.2, 13), (1, 0.0, 1)],
)
def test_threads_are_the_cores_the_load_leaves_free(cores: int, load: float, threads: int) -> None:
    assert cpu_training.threads_for(cores, load) == threads


def test_bf16_autocast_on_this_box_follows_the_weights_dtype() -> None:
    """On a GPU box as before (the GPU's bf16); on a CPU only for bf16 weights, and only where the CPU has
    bf16 kernels; a float32 model never trains under bf16 autocast on the CPU."""
    import torch

    if torch.cuda.is_available():
        assert cpu_training.bf16_autocast("float32") == torch.cuda.is_bf16_supported()
        return
    assert cpu_training.bf16_autocast(torch.float32) is False
    has_kernels = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert cpu_training.bf16_autocast(torch.bfloat16) is (has_kernels and cpu_training.on_cpu())
    assert cpu_training.bf16_autocast("bfloat16") is (has_kernels and cpu_training.on_cpu())
    cfg, _ = parse_config([], {})
    args = grpo_args(cfg, use_bf16=has_kernels and cpu_training.on_cpu())
    assert args.bf16 is args.use_cpu  # transformers takes bf16 on the CPU only with use_cpu


@pytest.mark.parametrize(("batch", "accum", "generations"), [(3, 1, 8), (5, 2, 7), (1, 1, 2)])
def test_any_batch_splits_into_whole_groups(batch: int, accum: int, generations: int) -> None:
    env = {"GRPO_BATCH_SIZE": str(batch), "GRPO_GRAD_ACCUM_STEPS": str(accum)}
    cfg, _ = parse_config([], {**env, "GRPO_NUM_GENERATIONS": str(generations)})
    args = grpo_args(cfg, use_bf16=False)
    assert args.generation_batch_size == batch * accum * generations
    assert args.steps_per_generation == args.gradient_accumulation_steps


def test_grpo_remedies_reach_trl() -> None:
    cfg, _ = parse_config(
        [],
        {
            "GRPO_BETA": "0.04",
            "GRPO_LOSS_TYPE": "dr_grpo",
            "GRPO_EPSILON_HIGH": "0.28",
            "GRPO_MASK_TRUNCATED_COMPLETIONS": "1",
            "GRPO_TOP_ENTROPY_QUANTILE": "0.2",
            "GRPO_SCALE_REWARDS": "batch",
        },
    )
    args = grpo_args(cfg, use_bf16=False)
    assert (args.beta, args.loss_type, args.epsilon_high) == (0.04, "dr_grpo", 0.28)
    assert args.mask_truncated_completions is True
    assert (args.top_entropy_quantile, args.scale_rewards) == (0.2, "batch")


BAD_VALUES = [
    ("GRPO_NUM_GENERATIONS", "six", "expected an integer >= 2"),
    ("GRPO_NUM_GENERATIONS", "1", "expected an integer >= 2"),
    ("GRPO_LEARNING_RATE", "-1e-5", "expected a number > 0"),
    ("GRPO_TEMPERATURE", "hot", "expected a number > 0"),
    ("GRPO_BATCH_SIZE", "0", "expected an integer >= 1"),
    ("GRPO_MAX_PROMPT", "704.5", "expected an integer >= 1"),
    ("GRPO_NUM_EPOCHS", "0", "expected a number > 0"),
    ("GRPO_TOP_ENTROPY_QUANTILE", "1.5", "expected a number > 0 and <= 1"),
    ("GRPO_LOSS_TYPE", "ppo", "expected one of grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo"),
    ("GRPO_SCALE_REWARDS", "yes", "expected one of group, batch, none"),
    ("GRPO_REPORT_TO", "mlflow", "expected one of none, tensorboard, wandb, trackio"),
    ("GRPO_VLLM_MODE", "remote", "expected one of colocate, server"),
    ("GRPO_MASK_TRUNCATED_COMPLETIONS", "maybe", "expected a boolean"),
    ("LORA_R", "-8", "expected an integer >= 1"),
    ("LORA_DROPOUT", "2", "expected a number >= 0 and <= 1"),
    ("LORA_BIAS", "some", "expected one of none, all, lora_only"),
    ("LORA_TARGET_MODULES", "q_proj,,v_proj", "expected comma-separated module names"),
    ("MIN_NON_EMPTY_LINES", "many", "expected an integer"),
    ("GRPO_MODEL_ID", "./no-such-model", "no model directory (config.json) there"),
    ("TRAINING_DATASET", "missing.jsonl", "no such file or folder"),
]


@pytest.mark.parametrize(("name", "raw", "expected"), BAD_VALUES, ids=[f"{n}={r}" for n, r, _ in BAD_VALUES])
def test_bad_value_stops_with_one_line_naming_it(name: str, raw: str, expected: str) -> None:
    result = run_train_py([], {name: raw})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"error: {name}={raw!r}: {expected}")
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_bad_flag_value_names_the_variable_too() -> None:
    result = run_train_py(["--num-generations", "six"], {})
    assert result.returncode == 2
    assert result.stderr == "error: GRPO_NUM_GENERATIONS='six': expected an integer >= 2\n"


def test_few_shot_example_below_full_marks_stops_before_the_model_loads() -> None:
    # With no time to compile, the prompt's own example scores 0.05: it would teach what the reward punishes.
    result = run_train_py(["--training-dataset", "data/problems.jsonl"], {"OCAML_COMPILE_TIMEOUT": "0.001"})
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: few-shot example 'to_list' scores 0.05")


def test_resume_without_checkpoint_is_one_line(tmp_path) -> None:
    result = run_train_py(["--resume", "--output-dir", str(tmp_path)], {})
    assert result.returncode == 2
    assert result.stderr == f"error: --resume: no checkpoint-* folder in GRPO_OUTPUT_DIR={str(tmp_path)!r}\n"


# Run in a fresh interpreter: records the call stack of the first import of each heavy module (a meta path
# finder sees every import before it happens), so that a failure says which line of which module imported it.
WATCH_IMPORTS = """
import json, sys, traceback
HEAVY = ("torch", "transformers", "trl", "peft")
first_import = {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY and name not in first_import:
            first_import[name] = "".join(traceback.format_stack()[:-1])
        return None  # the import itself goes on as usual

sys.meta_path.insert(0, Watch())
import train
exit_status = train.main(json.loads(sys.argv[1]), json.loads(sys.argv[2]))
print(json.dumps({"exit": exit_status, "imported": first_import}))
"""


def heavy_imports(argv: list[str], environ: dict[str, str]) -> tuple[int, dict[str, str]]:
    """train.main(argv, environ)'s exit status in a fresh interpreter, and the heavy modules it imported,
    each with the stack that imported it."""
    result = subprocess.run(
        [sys.executable, "-c", WATCH_IMPORTS, json.dumps(argv), json.dumps(environ)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout.splitlines()[-1])
    return shown["exit"], shown["imported"]


def importers(imported: dict[str, str]) -> str:
    return "\n".join(f"{module} was first imported from:\n{stack}" for module, stack in imported.items())


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        ([], {"GRPO_NUM_GENERATIONS": "six"}),  # a bad value
        (["--training-dataset", "no/such/file.jsonl"], {}),  # a path checked after the values
        (["--print-config", "--generation", "compiled"], {"TORCHINDUCTOR_FREEZING": "1"}),  # a refusal
    ],
    ids=["value", "path", "refused-compiled"],
)
def test_config_errors_never_import_torch(argv: list[str], environ: dict[str, str]) -> None:
    exit_status, imported = heavy_imports(argv, environ)
    assert exit_status == 2
    assert not imported, importers(imported)


def test_print_config_imports_torch_only_to_ask_it_about_a_gpu() -> None:
    """Resolving GRPO_GENERATION=auto asks torch whether it can use a GPU only where the CUDA driver shows one
    (settings.torch_cuda_missing), so --print-config imports torch on a GPU box and on no other; a set value
    never imports it."""
    assert heavy_imports(["--print-config", "--generation", "plain"], {}) == (0, {})
    exit_status, imported = heavy_imports(["--print-config"], {})
    assert exit_status == 0
    if settings._cuda_visible():
        assert list(imported) == ["torch"], importers(imported)
        assert "in torch_cuda_missing" in imported["torch"]
    else:
        assert not imported, importers(imported)


def test_print_config_shows_values_and_sources(capsys) -> None:
    assert main(["--print-config", "--lora-r", "16"], {"GRPO_TEMPERATURE": "1.1"}) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lora_r"] == {"value": 16, "source": "flag"}
    assert shown["temperature"] == {"value": 1.1, "source": "env"}
    assert shown["num_generations"] == {"value": 6, "source": "default"}
    assert shown["min_non_empty_lines"] == {"value": 8, "source": "default"}  # the reward's settings too
    trl_names = {"per_device_train_batch_size", "learning_rate", "max_completion_length", "max_prompt_length"}
    assert trl_names <= set(shown)


def test_demo_settings_beat_env_but_not_flags(capsys) -> None:
    assert main(["--demo", "--print-config", "--max-steps", "3"], {"GRPO_MAX_COMPLETION": "600"}) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["max_steps"] == {"value": 3, "source": "flag"}
    assert shown["max_completion_length"]["source"] == "demo"
    assert shown["output_dir"] == {"value": "grpo_runs/demo", "source": "demo"}
    assert shown["model_id"] == {"value": "grpo_runs/demo/tiny-model", "source": "demo"}


def test_help_lists_every_setting_with_env_and_default(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse would wrap long defaults at their hyphens
    text = " ".join(build_parser().format_help().split())
    for field in envflags._settings(TrainConfig):
        assert f"[env {field.metadata['env']}, default {envflags._shown(field.default)}]" in text


def test_readme_configuration_table_is_current() -> None:
    readme = CONFIGURATION_DOC.read_text(encoding="utf-8")
    found = re.search(r"<!-- config-table:start -->\n(.*?)\n<!-- config-table:end -->", readme, re.S)
    assert found, "docs/configuration.md lacks the config-table markers"
    table = envflags.markdown_table(TrainConfig)
    assert found.group(1) == table, "regenerate: python train.py --config-table"


def test_config_table_flag_prints_the_table() -> None:
    result = run_train_py(["--config-table"], {})
    assert result.returncode == 0 and result.stdout == envflags.markdown_table(TrainConfig) + "\n"


def test_envrc_holds_the_seeds_recommendations_with_the_real_models_learning_rate() -> None:
    """The seed's fixes, but a LoRA's learning rate: the real 0.5B's learning bench (docs/real-model.md)."""
    result = subprocess.run(
        ["bash", "-c", f"source .envrc && exec {sys.executable} train.py --print-config"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "TRAINING_"))},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    expected = {
        "temperature": 1.1,
        "num_generations": 8,
        "learning_rate": 5e-5,
        "max_completion_length": 600,
        "max_prompt_length": 704,
    }
    for key, value in expected.items():
        assert shown[key] == {"value": value, "source": "env"}
    for line in (ROOT / ".envrc").read_text().splitlines():
        if line.startswith("export "):
            assert "#" in line, f"uncommented setting in .envrc: {line}"


def test_model_folder_without_tokenizer_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    argv = ["--model-id", str(tmp_path), "--training-dataset", "data/problems.jsonl", "--report-to", "none"]
    assert main([*argv, "--output-dir", str(tmp_path / "run")], environ={}) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: GRPO_MODEL_ID={str(tmp_path)!r}: cannot load its tokenizer (")
    assert len(err.splitlines()) == 1
