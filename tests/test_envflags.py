import argparse
from dataclasses import dataclass

import pytest

from envflags import ConfigError, add_argument, add_arguments, flag_of, markdown_table, resolve, setting


@dataclass
class Example:
    num_generations: int = setting(6, "GRPO_NUM_GENERATIONS", "completions per prompt", low=2)
    learning_rate: float = setting(5e-6, "GRPO_LEARNING_RATE", "peak rate", low=0, strict_low=True)
    beta: float | None = setting(None, "GRPO_BETA", "KL weight", low=0)
    curriculum: bool = setting(False, "REWARD_CURRICULUM", "phased weights")
    report_to: str = setting("none", "GRPO_REPORT_TO", "tracker", choices=("none", "wandb"))


def resolved(argv: list[str], environ: dict[str, str]):
    parser = argparse.ArgumentParser()
    add_arguments(parser, Example)
    return resolve(Example, parser.parse_args(argv), environ)


def test_flag_beats_env_beats_default() -> None:
    cfg, sources = resolved(["--num-generations", "8"], {"GRPO_NUM_GENERATIONS": "4", "GRPO_BETA": "0.04"})
    assert cfg.num_generations == 8 and sources["num_generations"] == "flag"
    assert cfg.beta == 0.04 and sources["beta"] == "env"
    assert cfg.learning_rate == 5e-6 and sources["learning_rate"] == "default"


def test_flag_names_follow_env_names() -> None:
    assert flag_of("GRPO_NUM_GENERATIONS") == "--num-generations"
    assert flag_of("LORA_R") == "--lora-r"
    assert flag_of("MIN_NON_EMPTY_LINES") == "--min-non-empty-lines"


@pytest.mark.parametrize(
    ("env", "raw", "message"),
    [
        ("GRPO_NUM_GENERATIONS", "six", "GRPO_NUM_GENERATIONS='six': expected an integer >= 2"),
        ("GRPO_NUM_GENERATIONS", "1", "GRPO_NUM_GENERATIONS='1': expected an integer >= 2"),
        ("GRPO_LEARNING_RATE", "-1e-5", "GRPO_LEARNING_RATE='-1e-5': expected a number > 0"),
        ("GRPO_LEARNING_RATE", "nan", "GRPO_LEARNING_RATE='nan': expected a number > 0"),
        ("REWARD_CURRICULUM", "maybe", "REWARD_CURRICULUM='maybe': expected a boolean (1/0, true/false)"),
        ("GRPO_REPORT_TO", "mlflow", "GRPO_REPORT_TO='mlflow': expected one of none, wandb"),
    ],
)
def test_bad_values_name_the_variable(env: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolved([], {env: raw})
    assert str(err.value) == message


def test_optional_and_bool_values() -> None:
    cfg, _ = resolved([], {"GRPO_BETA": "none", "REWARD_CURRICULUM": "1"})
    assert cfg.beta is None and cfg.curriculum is True
    assert resolved(["--reward-curriculum"], {})[0].curriculum is True
    assert resolved(["--reward-curriculum", "0"], {"REWARD_CURRICULUM": "1"})[0].curriculum is False


def test_markdown_table_lists_every_setting() -> None:
    table = markdown_table(Example)
    assert "| `GRPO_NUM_GENERATIONS` | `--num-generations` | `6` | completions per prompt |" in table
    assert table.count("\n") == 2 + 4


def test_a_tool_takes_one_setting_as_its_flag() -> None:
    parser = argparse.ArgumentParser()
    add_argument(parser, Example, "report_to")
    text = parser.format_help()
    assert "--report-to" in text and "[env GRPO_REPORT_TO, default none]" in text and "--beta" not in text
    assert resolve(Example, parser.parse_args(["--report-to", "wandb"]), {})[0].report_to == "wandb"
