"""The control run's reward (GRPO_REWARD_CONTROL=shuffled): the OCaml reward's values, blind to which
completion earned them.

A gain in a GRPO run counts only against a run trained the same way on a reward that knows nothing of
OCaml: Qwen2.5 models are known to improve on some benchmarks under GRPO even with random rewards (Shao et
al. 2025, "Spurious Rewards"). Shuffling each call's rewards across its completions (seeded by GRPO_SEED)
keeps the step's reward mean and spread exactly, so the optimizer sees rewards of the same size, while the
advantage a completion gets says nothing about its code. Every log line stays the real reward's: the
completion and breakdown logs, the stage shares, learning.log's reward column (a permutation keeps its mean
and std) and the held-out evaluation, which scores with the reward itself.
"""

from __future__ import annotations

import random
from typing import Any


class ShuffledReward:
    """A reward callable that awaits `reward` and returns its values permuted."""

    def __init__(self, reward: Any, seed: int):
        self.reward = reward
        self.rng = random.Random(seed)
        self.__name__ = reward.__name__  # TRL names the reward's metrics after it: the same columns

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float]:
        rewards = list(await self.reward(*args, **kwargs))
        self.rng.shuffle(rewards)
        return rewards

    def __getattr__(self, name: str) -> Any:
        # hold_logs, write_held, close: dynamic sampling and train.py talk to the reward itself
        if name == "reward":  # not yet set (a copy in the making): no recursion
            raise AttributeError(name)
        return getattr(self.reward, name)
