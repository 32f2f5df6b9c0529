"""shared_prompts.completion_scores against TRL's own scoring of a pass, on the tiny model with a LoRA that
has an effect, in float32: the same log-probabilities, entropies and LoRA gradients, with each distinct prompt
run through the model once and the columns no row attends to left out; and a training run on the CPU whose
passes each hold one group and score it that way."""

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer
from trl.trainer import grpo_trainer
from trl.trainer.utils import add_fused_lm_head

import cpu_training
import shared_prompts
import train
from bench.train_step import give_lora_an_effect, prompt_batch
from conftest import SEVEN, first_layer_shapes
from problems import BUNDLED_PROBLEMS, load_problems

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOLERANCE = 1e-5  # float32; the test's LoRA moves the log-probabilities by far more (asserted)
TEMPERATURE = 0.9


def policy(tiny_model: Path, effect: float = 0.05):
    """The tiny model in float32 with TRL's fused LM head (log-probabilities and entropies) and a LoRA on all
    seven projections, without dropout (train mode, so the forward keeps its graph as in the update)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).float()
    add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=SEVEN, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    give_lora_an_effect(model, std=effect)
    return model.train()


def round_rows(
    tiny_model: Path, groups: int, group_size: int, pad: int = 2, lengths: list[int] | None = None
):
    """A pass as TRL joins it: `groups` prompts (of two lengths) repeated `group_size` times, left-padded by
    `pad` more columns than the longest needs, then completions of different lengths (`lengths`, or 1 to 10
    tokens) right-padded by `pad` more columns than the longest; and the completion width."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    problems = load_problems(str(BUNDLED_PROBLEMS))
    chosen = [problems[0], problems[5], problems[9]][:groups]
    ids, mask = prompt_batch(tokenizer, [p for p in chosen for _ in range(group_size)])
    ids = torch.cat([torch.full((len(ids), pad), tokenizer.pad_token_id), ids], dim=1)
    mask = torch.cat([torch.zeros(len(mask), pad, dtype=mask.dtype), mask], dim=1)
    rows = len(ids)
    lengths = torch.tensor(lengths) if lengths else torch.arange(rows) % 10 + 1
    width = int(lengths.max()) + pad  # every row ends before the padding columns
    completion = torch.randint(5, 2000, (rows, width), generator=torch.Generator().manual_seed(1))
    completion_mask = (torch.arange(width) < lengths[:, None]).long()
    completion = completion.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    return torch.cat([ids, completion], dim=1), torch.cat([mask, completion_mask], dim=1), width


def trl_scores(model, ids, mask, width):
    """TRL's own GRPOTrainer._get_per_token_logps_and_entropies for the pass (its body, without the profiling
    wrapper): the trainer's only attribute it reads is its accelerator's autocast, none here (float32)."""
    trainer = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext))
    logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
        trainer, model, ids, mask, width, compute_entropy=True
    )
    return logps, entropies


def layer_inputs(model, score) -> tuple[list[tuple[int, int]], tuple]:
    """The (rows, columns) the first decoder layer saw while `score()` ran, and what it returned."""
    with first_layer_shapes(model) as shapes:
        return shapes, score()


def gradients_of(model, logps, entropies, mask) -> dict[str, torch.Tensor]:
    """The LoRA's gradients of a loss of both outputs over the completion tokens (then cleared)."""
    ((logps * mask).sum() + 0.1 * (entropies * mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def assert_same_scores_and_gradients(model, ids, mask, width, expected_shapes) -> None:
    completion_mask = mask[:, -width:]
    trl_shapes, (trl_logps, trl_entropies) = layer_inputs(model, lambda: trl_scores(model, ids, mask, width))
    assert trl_shapes == [tuple(ids.shape)]  # every row's prompt, every column
    trl_grads = gradients_of(model, trl_logps, trl_entropies, completion_mask)
    shapes, (logps, entropies) = layer_inputs(
        model, lambda: shared_prompts.completion_scores(model, ids, mask, width, compute_entropy=True)
    )
    assert shapes == expected_shapes
    assert logps.shape == entropies.shape == trl_logps.shape == (len(ids), width)
    assert (logps - trl_logps).abs().max().item() < TOLERANCE
    assert (entropies - trl_entropies).abs().max().item() < TOLERANCE
    assert not logps[completion_mask == 0].any()  # masked positions score 0, as in TRL
    grads = gradients_of(model, logps, entropies, completion_mask)
    assert grads.keys() == trl_grads.keys() and len(grads) == 2 * 7 * model.config.num_hidden_layers
    for name, grad in grads.items():
        scale = trl_grads[name].abs().max().item()
        assert scale > 0 and (grad - trl_grads[name]).abs().max().item() <= TOLERANCE * max(1.0, scale), name


def test_a_pass_of_two_groups_scores_as_trl_does_with_each_prompt_run_once(tiny_model: Path) -> None:
    model = policy(tiny_model)
    ids, mask, width = round_rows(tiny_model, groups=2, group_size=3)
    prompt = ids.shape[1] - width - 2  # the two padding columns no row attends to are left out
    longest = int(mask[:, -width:].sum(1).max())
    assert longest == 6 < width
    # The 2 prompts but their last tokens, once each; then every row's last prompt token and its completion,
    # up to the longest completion.
    assert_same_scores_and_gradients(model, ids, mask, width, [(2, prompt - 1), (6, 1 + longest)])
    # The LoRA's effect on the scores is far above the tolerance: a wrong prompt would show.
    bare = policy(tiny_model, effect=0.0)
    moved = (trl_scores(bare, ids, mask, width)[0] - trl_scores(model, ids, mask, width)[0]).abs().max()
    assert moved.item() > 100 * TOLERANCE


def test_a_group_of_unlike_completion_lengths_runs_them_in_forwards_of_like_lengths(tiny_model: Path) -> None:
    model = policy(tiny_model)
    ids, mask, width = round_rows(tiny_model, groups=1, group_size=4, lengths=[3, 40, 2, 2])
    prompt = ids.shape[1] - width - 2
    # The prompt once; then the three short rows up to 3 tokens, and the long one alone (one forward of all
    # four would run 4 x 40 positions, two run 3 x 3 + 40, at BUCKET_OVERHEAD positions a forward more).
    assert shared_prompts.length_buckets([3, 40, 2, 2]) == [[2, 3, 0], [1]]
    assert_same_scores_and_gradients(model, ids, mask, width, [(1, prompt - 1), (3, 1 + 3), (1, 1 + 40)])


@pytest.mark.parametrize(
    ("lengths", "overhead", "buckets"),
    [
        ([5, 5, 5], 32, [[0, 1, 2]]),
        ([10, 200, 10, 200], 32, [[0, 2], [1, 3]]),
        ([1, 2, 3, 4], 0, [[0], [1], [2], [3]]),  # no cost to a forward: every length its own
        ([1, 50, 100], 10_000, [[0, 1, 2]]),  # a forward dearer than any padding: one
        ([], 32, []),
    ],
)
def test_length_buckets_run_the_fewest_positions(lengths, overhead, buckets) -> None:
    assert shared_prompts.length_buckets(lengths, overhead) == buckets


def test_rows_of_their_own_prompts_are_scored_whole_without_the_unattended_columns(tiny_model: Path) -> None:
    model = policy(tiny_model)
    ids, mask, width = round_rows(tiny_model, groups=3, group_size=1)
    prompt, longest = ids.shape[1] - width - 2, 3
    assert_same_scores_and_gradients(model, ids, mask, width, [(3, prompt + longest)])


@pytest.mark.parametrize("checkpointing", ["off", "on"])
def test_a_cpu_training_run_scores_each_pass_of_one_group_with_its_prompt_once(
    tiny_model: Path, tmp_path: Path, checkpointing: str
) -> None:
    """2 prompts x 4 completions a step at GRPO_BATCH_SIZE 2: on the CPU each pass holds one whole group, 4
    rows (TRL's passes of 2 rows, shuffled, would hold rows of both groups), scored through completion_scores
    with its prompt run once; with gradient checkpointing, whose layers drop a cache, TRL scores every pass
    of 2 rows itself. TRL's methods are TRL's again after."""
    if not cpu_training.on_cpu():
        pytest.skip("the update shares prompts on the CPU; a GPU box keeps TRL's path")
    passes: list[int] = []

    def distinct_prompts(policy, ids, mask):
        passes.append((len(ids), len(torch.unique(torch.cat([ids, mask], dim=1), dim=0))))
        return distinct_prompt_cache(policy, ids, mask)

    distinct_prompt_cache = shared_prompts.distinct_prompt_cache
    scoring, shuffle = GRPOTrainer._get_per_token_logps_and_entropies, grpo_trainer.shuffle_sequence_dict
    flags = [
        *("--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS)),
        *("--output-dir", str(tmp_path / "out"), "--max-steps", "2", "--save-steps", "5"),
        *("--batch-size", "2", "--num-generations", "4", "--grad-accum-steps", "1", "--max-completion", "8"),
        *("--lora-r", "4", "--lora-alpha", "8", "--eval-steps", "none", "--report-to", "none"),
        *("--gradient-checkpointing", checkpointing),
    ]
    with mock.patch.object(shared_prompts, "distinct_prompt_cache", distinct_prompts):
        assert train.main(flags, environ={}) == 0
    assert passes == (
        [(4, 1)] * 4 if checkpointing == "off" else []
    )  # 2 steps x 2 passes of 4 rows, 1 prompt
    log = (tmp_path / "out" / "learning.log").read_text()
    passes_note = (
        "passes of 4 completions (a group each" if checkpointing == "off" else "passes of 2 completions\n"
    )
    assert passes_note in log
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert GRPOTrainer._get_per_token_logps_and_entropies is scoring
    assert grpo_trainer.shuffle_sequence_dict is shuffle
