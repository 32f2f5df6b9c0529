"""Dynamic sampling (DAPO, section 3.2) on TRL's GRPOTrainer: groups whose rewards tie never reach the loss.

A group whose completions all score the same (all pass, or all fail alike) has zero advantage: it costs a
forward and a backward pass and teaches nothing, and the seed saw a quarter to half of its groups tie
(`frac_zero_std` 0.25-0.50). With GRPO_DYNAMIC_SAMPLING=filter, `DynamicSamplingTrainer` scores a round as
TRL does, drops the groups whose rewards all lie within TIE_TOLERANCE, and samples further rounds of prompts,
in data order, until the step holds a round's worth of informative groups on every process or
GRPO_DYNAMIC_MAX_ROUNDS extra rounds are spent. A step still short then trains on the informative groups it
has, fewer of them (docs/dynamic-sampling.md has the measurement behind that choice); a step with none makes
no update at all.

It is a subclass, not a fork of TRL's loop. TRL still samples and scores every round
(`_generate_and_score_completions`, so plain, compiled and vLLM sampling all work as they do without it);
the subclass picks the rows, re-counts the loss normaliser over the rows it keeps, and splits them into the
step's micro-batches. Extra rounds come from the trainer's own epoch iterator, so an epoch is still every
problem once; the data position (epoch, batches read) goes into each checkpoint, and a resumed run skips
exactly those batches, with the epoch's own shuffle. With `off` every method hands straight to TRL's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.trainer import grpo_trainer
from trl.trainer.utils import RepeatSampler

MODES = ("off", "filter")
TIE_TOLERANCE = 1e-6  # rewards of a group all within this of each other: the group tied
POSITION_FILE = "dynamic_sampling.json"  # in each checkpoint: where the data stood
# The per-row tensors TRL's round hands the loss, by how their second dimension is padded.
PROMPT_SIDE = {"prompt_ids": "pad", "prompt_mask": 0}  # left-padded
COMPLETION_SIDE = {
    "completion_ids": "pad",
    "completion_mask": 0,
    "tool_mask": 0,
    "old_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "importance_sampling_ratio": 0.0,
}  # right-padded


def describe(max_rounds: int, prompts_per_round: int) -> str:
    """The run's note on what filtering does, in learning.log's header."""
    return (
        f"dynamic sampling: filter; groups whose rewards all tie (within {TIE_TOLERANCE:g}) are dropped, "
        f"and a step samples up to {max_rounds} extra round(s) of {prompts_per_round} prompts, in data "
        "order, to fill itself; a step still short trains on fewer groups (kept=K/N on its line), one with "
        "none changes nothing"
    )


def tied_groups(rewards: torch.Tensor, group_size: int, tolerance: float = TIE_TOLERANCE) -> torch.Tensor:
    """One bool per group of `group_size` consecutive rewards: True where the scored ones (NaN = unscorable)
    all lie within `tolerance`; a group with fewer than two scored completions ties too."""
    grouped = rewards.view(-1, group_size)
    scored = ~torch.isnan(grouped)
    high = torch.where(scored, grouped, torch.full_like(grouped, -math.inf)).max(dim=1).values
    low = torch.where(scored, grouped, torch.full_like(grouped, math.inf)).min(dim=1).values
    return (scored.sum(dim=1) < 2) | (high - low <= tolerance)


def micro_batch_sizes(rows: int, chunks: int) -> list[int]:
    """`rows` split into `chunks` micro-batches as evenly as can be, the smaller ones first: a step's last
    micro-batch is the one whose backward pass all-reduces the gradients, so it must not be empty."""
    small, extra = divmod(rows, chunks)
    return [small] * (chunks - extra) + [small + 1] * extra


def split_rows(batch: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    """TRL's split_tensor_dict for micro-batches of the given sizes (it needs equal ones)."""
    chunks, start = [], 0
    for size in sizes:
        chunk = {}
        for key, value in batch.items():
            is_rows = isinstance(value, list) or (isinstance(value, torch.Tensor) and value.ndim > 0)
            chunk[key] = value[start : start + size] if is_rows else value
        chunks.append(chunk)
        start += size
    return chunks


def padded(tensors: list[torch.Tensor], value: float, left: bool) -> torch.Tensor:
    """Row-concatenation of 2-D tensors of different widths, padded on the left or the right."""
    width = max(t.shape[1] for t in tensors)
    grown = []
    for t in tensors:
        pad = (width - t.shape[1], 0) if left else (0, width - t.shape[1])
        grown.append(torch.nn.functional.pad(t, pad, value=value))
    return torch.cat(grown, dim=0)


def concat_rounds(parts: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """The rows picked from several of TRL's rounds as one batch (the caller counts num_items_in_batch)."""
    out: dict[str, Any] = {}
    for key in parts[0]:
        if key == "num_items_in_batch":
            continue
        values = [p[key] for p in parts]
        if key in PROMPT_SIDE or key in COMPLETION_SIDE:
            pad = {**PROMPT_SIDE, **COMPLETION_SIDE}[key]
            pad = pad_token_id if pad == "pad" else pad
            if values[0].ndim == 2 and not (key == "importance_sampling_ratio" and values[0].shape[1] == 1):
                out[key] = padded(values, pad, left=key in PROMPT_SIDE)
            else:
                out[key] = torch.cat(values, dim=0)
        elif key == "advantages":
            out[key] = torch.cat(values, dim=0)
        else:  # images and the like: TRL's multimodal fields have their own layouts
            raise ValueError(f"GRPO_DYNAMIC_SAMPLING=filter: cannot pick rows of {key!r} (multimodal rounds)")
    return out


def pick_rows(output: dict[str, Any], rows: torch.Tensor) -> dict[str, Any]:
    """The given rows of one round's output (the per-row tensors only)."""
    return {
        key: value[rows]
        for key, value in output.items()
        if key != "num_items_in_batch" and isinstance(value, torch.Tensor) and value.ndim > 0
    }


@dataclass
class Round:
    """One scored round on this process: TRL's output and, per local group, whether its rewards tied."""

    output: dict[str, Any]
    tied: list[bool]
    kept: list[bool] = field(default_factory=list)  # filled once the step's groups are chosen


class EpochRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler, whose n-th pass shuffles as pass `first_epoch + n` of a fresh one would: a run
    resumed in epoch 3 reads epoch 3's order, not epoch 0's (RepeatSampler's generator restarts with it)."""

    first_epoch = 0
    passes = 0

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            self.generator.manual_seed(self.seed if self.seed is not None else 0)
            for _ in range(self.first_epoch + self.passes):
                torch.randperm(self.num_samples, generator=self.generator)
        self.passes += 1
        return super().__iter__()


class DynamicSamplingTrainer(GRPOTrainer):
    """GRPOTrainer with `dynamic_sampling="filter"`: see the module docstring. `note` gets the run's notes
    (short steps, data running out); `max_rounds` caps the extra rounds of one step."""

    def __init__(
        self,
        *args: Any,
        dynamic_sampling: str = "off",
        max_rounds: int = 3,
        note: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> None:
        if dynamic_sampling not in MODES:
            raise ValueError(f"dynamic_sampling={dynamic_sampling!r}: expected one of {', '.join(MODES)}")
        super().__init__(*args, **kwargs)
        self.filtering = dynamic_sampling == "filter"
        self.max_rounds = max_rounds
        self.note = note or (lambda text: None)
        self._sampler: EpochRepeatSampler | None = None  # set by _get_train_sampler, in both modes
        if not self.filtering:
            return
        if (
            self.num_iterations != 1
            or self.args.steps_per_generation != self.args.gradient_accumulation_steps
        ):
            raise ValueError(
                "GRPO_DYNAMIC_SAMPLING=filter needs one round per optimizer step (num_iterations=1, "
                "steps_per_generation=gradient_accumulation_steps), as train.py sets them"
            )
        self._epoch_iterator: Iterator | None = None
        self._data_epoch = 0  # the epoch being read, and how many dataloader batches of it were read
        self._batches_read = 0
        self._start: tuple[int, int] = (0, 0)  # where this train() call starts reading
        self._steps_in_epoch = 1
        self._planned_steps = 0
        self._told_all_tied = False
        self._round_rewards: torch.Tensor | None = None
        self.add_callback(DataPosition(self))

    # --- the data: extra rounds from the epoch iterator, the position in checkpoints ----------------------

    def _get_train_sampler(self, dataset=None):
        # In both modes: a fresh run reads exactly TRL's order, and a resumed one its own epoch's (TRL's
        # RepeatSampler would replay epoch 0's shuffle in whatever epoch a run resumes).
        self._sampler = EpochRepeatSampler(
            data_source=dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )
        return self._sampler

    def set_initial_training_values(self, args, dataloader):
        values = list(super().set_initial_training_values(args, dataloader))
        if self.filtering:
            num_train_epochs, steps_in_epoch, max_steps = values[0], values[5], values[6]
            self._steps_in_epoch, self._planned_steps = steps_in_epoch, max_steps
            if args.max_steps > 0:  # a step may read up to 1 + max_rounds rounds: enough epochs for max_steps
                values[0] = num_train_epochs * (1 + self.max_rounds)
        return tuple(values)

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume, trial):
        epoch, batches = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume, trial
        )
        position = os.path.join(resume, POSITION_FILE) if resume else None
        if position and os.path.isfile(position):  # written by a filtering run: TRL's guess would be wrong
            with open(position, encoding="utf-8") as f:
                saved = json.load(f)
            epoch, batches = int(saved["epoch"]), int(saved["batches"])
        if self._sampler is not None:
            self._sampler.first_epoch, self._sampler.passes = epoch, 0
        if self.filtering:
            self._start = (epoch, batches)
            self._epoch_iterator = None
        return epoch, batches

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if self.filtering and epoch_iterator is not self._epoch_iterator:  # a new epoch begins
            first = self._epoch_iterator is None
            self._epoch_iterator = epoch_iterator
            self._data_epoch = self._start[0] if first else self._data_epoch + 1
            self._batches_read = self._start[1] if first else 0
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.filtering:
            self._batches_read += len(batches)
        return batches, num_items

    def _next_round(self) -> list[dict] | None:
        """The next round's rows from the epoch iterator (it repeats each round steps_per_generation times,
        the copies are skipped); None once the epoch's data is used up."""
        first = None
        for _ in range(self.args.steps_per_generation):
            try:
                batch = next(self._epoch_iterator)
            except StopIteration:
                break
            self._batches_read += 1
            first = batch if first is None else first
        return first

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.filtering and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            with open(os.path.join(folder, POSITION_FILE), "w", encoding="utf-8") as f:
                json.dump({"epoch": self._data_epoch, "batches": self._batches_read}, f)

    # --- a step: rounds until enough groups are informative, then the rows that train ---------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.filtering:
            self._round_rewards = rewards_per_func  # gathered over processes, as TRL's advantages are
        return rewards_per_func

    def _prepare_inputs(self, generation_batch):
        if not self.filtering or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        # TRL's buffering, with micro-batches of unequal size: a short step has fewer rows than a round.
        if self._step % self.args.steps_per_generation == 0 or self._buffered_inputs is None:
            # TRL's shuffle, looked up when called: on the CPU cpu_training keeps the round's order instead.
            batch = grpo_trainer.shuffle_sequence_dict(self._sample_informative_groups(generation_batch))
            rows = batch["completion_ids"].shape[0]
            self._buffered_inputs = split_rows(batch, micro_batch_sizes(rows, self.args.steps_per_generation))
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.filtering and self.model.training and inputs["completion_ids"].shape[0] == 0:
            # No row in this micro-batch: a loss that touches no weight, so it adds no gradient (a step
            # with no informative group at all leaves every weight and the optimizer's moments as they are).
            return torch.zeros((), device=self.accelerator.device, requires_grad=True)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _rewards_of_round(self) -> torch.Tensor:
        """The round's total reward per completion (all processes), as TRL weights and sums them."""
        per_func = self._round_rewards
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)
        total = (per_func * weights).nansum(dim=1)
        total[torch.isnan(per_func).all(dim=1)] = math.nan
        return total

    def _global_min(self, value: int) -> int:
        return int(self.accelerator.gather(torch.tensor([value], device=self.accelerator.device)).min())

    def _sample_informative_groups(self, inputs: list[dict]) -> dict[str, Any]:
        """Score rounds until every process holds a round's worth of informative groups (or the round cap or
        the epoch's data is reached); return this process's rows of the groups that train."""
        group = self.num_generations
        target = len(inputs) // group  # groups per process in one round
        first_group = self.accelerator.process_index * target
        frac_mark = len(self._metrics["train"]["frac_reward_zero_std"])
        markers = [f for f in self.reward_funcs if hasattr(f, "hold_logs")]
        for reward in markers:
            reward.hold_logs()
        rounds: list[Round] = []
        batch: list[dict] | None = inputs
        ran_out = False
        while True:
            output = super()._generate_and_score_completions(batch)
            rewards = self._rewards_of_round()
            tied = tied_groups(rewards, group)[first_group : first_group + target]
            rounds.append(Round(output, tied.tolist()))
            least = self._global_min(sum(not t for r in rounds for t in r.tied))  # over every process
            if least >= target or len(rounds) > self.max_rounds:
                break
            batch = self._next_round()
            if self._global_min(int(batch is not None)) == 0:  # even shards run out together; never hang
                ran_out = True
                break
        # Equal shapes on every process: each trains as many groups as the one with the fewest has.
        self._choose_kept(rounds, min(target, least))
        for reward in markers:
            reward.write_held(
                [
                    {"sampling": "kept" if kept else "dropped", "sampling_round": i}
                    for i, r in enumerate(rounds)
                    for kept in r.kept
                    for _ in range(group)
                ]
            )
        self._record_step(rounds, target, ran_out, frac_mark)
        return self._training_rows(rounds)

    def _choose_kept(self, rounds: list[Round], trained: int) -> None:
        """Marks the groups that train (each round's `kept`): the first `trained` informative ones, in the
        order they were sampled. A step short of a round's groups trains smaller (bench/dynamic_sampling.py's
        `fill` arm, a subclass, tops it up instead)."""
        left = trained
        for r in rounds:
            r.kept = []
            for t in r.tied:
                r.kept.append(not t and left > 0)
                left -= int(r.kept[-1])

    def _training_rows(self, rounds: list[Round]) -> dict[str, Any]:
        """The kept groups' rows of every round as one batch, with the loss normaliser counted over them."""
        group = self.num_generations
        parts = []
        for r in rounds:
            rows = torch.tensor(
                [g * group + k for g, kept in enumerate(r.kept) if kept for k in range(group)]
            )
            parts.append(pick_rows(r.output, rows.long().to(self.accelerator.device)))
        batch = concat_rounds(parts, self._tokenizer.pad_token_id)
        mask = (
            batch["completion_mask"] * batch["tool_mask"]
            if "tool_mask" in batch
            else batch["completion_mask"]
        )
        batch["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        return batch

    def _record_step(self, rounds: list[Round], target: int, ran_out: bool, frac_mark: int):
        """The step's dynamic/* metrics (over all processes); TRL's frac_reward_zero_std describes the
        groups that train (none tied), while its reward and stage metrics average every sampled round."""
        trained = sum(sum(r.kept) for r in rounds)
        trained_tied = sum(k and t for r in rounds for k, t in zip(r.kept, r.tied, strict=True))
        local = torch.tensor(
            [sum(len(r.tied) for r in rounds), sum(sum(r.tied) for r in rounds), trained, trained_tied],
            device=self.accelerator.device,
        )
        sampled, tied, trained_all, trained_tied = (
            int(v) for v in self.accelerator.gather(local).view(-1, 4).sum(dim=0)
        )
        metrics = self._metrics["train"]
        del metrics["frac_reward_zero_std"][frac_mark:]
        if trained:  # the trained batch: none tied (but in the bench's `fill` arm)
            metrics["frac_reward_zero_std"].append(trained_tied / trained_all)
        metrics["dynamic/extra_rounds"].append(float(len(rounds) - 1))
        metrics["dynamic/groups_sampled"].append(float(sampled))
        metrics["dynamic/groups_dropped"].append(float(sampled - trained_all))
        metrics["dynamic/groups_trained"].append(float(trained_all))
        metrics["dynamic/frac_zero_std_sampled"].append(tied / sampled)
        step = self.state.global_step + 1
        if ran_out:
            self.note(
                f"dynamic sampling: the epoch's data ran out while step {step} was being filled; it trains "
                f"{trained} of {target} groups per process"
            )
        if not trained and not self._told_all_tied:
            self._told_all_tied = True
            self.note(
                f"dynamic sampling: every group sampled for step {step} tied, so the step changes no weight "
                "(learning.log shows such steps as kept=0/N)"
            )


class DataPosition(TrainerCallback):
    """Sets the trainer's epoch to where the data stands (a filtering step may read several rounds), and
    says at the end when the data ended the run before the steps TRL planned."""

    def __init__(self, trainer: DynamicSamplingTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        state.epoch = t._data_epoch + t._batches_read / max(t._steps_in_epoch, 1)

    def on_train_end(self, args, state, control, **kwargs):
        t = self.trainer
        if args.max_steps <= 0 and state.global_step < t._planned_steps:
            t.note(
                f"dynamic sampling: the data ended the run at step {state.global_step}; without filtering "
                f"it would have run {t._planned_steps} steps, and the learning-rate schedule was planned for "
                "those"
            )
