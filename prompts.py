"""The prompt: the system message, the worked example, prompt budgets, and the rows TRL trains on (GRPO's
prompts, SFT's prompt-completion pairs)."""

from __future__ import annotations

from collections.abc import Callable

from envflags import ConfigError
from problems import parse_problem
from rewards import END_MARKER, RewardConfig, own_definition, score_completion
from settings import TrainConfig

SYSTEM_PROMPT = (
    "You are an expert OCaml programmer. Complete the function the user gives you. Reply with one "
    "```ocaml code block holding the complete definition, starting with the given signature line, without "
    "the doc comment or the type definitions. End the block with the line "
    + END_MARKER
    + " and write nothing after it."
)

# Each example is (problem, tests, answer). train.py scores them with the real reward before training:
# an example below full marks would teach the model what the reward punishes. One example keeps the
# prompt well inside the seed's 704 tokens.
FEW_SHOT = [
    (
        "(** Return the values of [t] in order: left subtree, value, right subtree.\n"
        "    >>> to_list (Node (Node (Leaf, 1, Leaf), 2, Node (Leaf, 3, Leaf)))\n"
        "    [1; 2; 3]\n"
        "*)\n"
        "type tree = Leaf | Node of tree * int * tree\n\n"
        "let to_list (t : tree) : int list =",
        "let () =\n"
        "  assert (to_list (Node (Node (Leaf, 1, Leaf), 2, Node (Leaf, 3, Leaf))) = [1; 2; 3]);\n"
        "  assert (to_list Leaf = []);\n"
        "  assert (to_list (Node (Leaf, 5, Leaf)) = [5]);\n"
        "  assert (to_list (Node (Node (Node (Leaf, 1, Leaf), 2, Leaf), 3, Leaf)) = [1; 2; 3]);\n"
        ";;",
        "```ocaml\n"
        "let to_list (t : tree) : int list =\n"
        "  let rec walk t acc =\n"
        "    match t with\n"
        "    | Leaf -> acc\n"
        "    | Node (left, v, right) ->\n"
        "      let acc = walk right acc in\n"
        "      let acc = v :: acc in\n"
        "      walk left acc\n"
        "  in\n"
        "  walk t []\n"
        f"{END_MARKER}\n"
        "```",
    ),
]


def build_prompt_messages(problem: str, *, few_shot: int = 1) -> list[dict]:
    """System message, the first `few_shot` examples as earlier turns, then the problem (chat template). The
    prompt asks for no length: the line gate guards partial credit, and a right two-line answer is right."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for example, _tests, answer in FEW_SHOT[:few_shot]:
        messages += [{"role": "user", "content": example}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": problem})
    return messages


def check_few_shot(cfg: RewardConfig) -> None:
    """Refuse to start when a few-shot answer would not earn full marks under this run's reward and sandbox
    settings: it would teach what the reward punishes."""
    for problem, tests, answer in FEW_SHOT:
        result = score_completion(problem, tests, answer, cfg=cfg)
        if result["total_reward"] < 1.0:
            name = problem.rsplit("let ", 1)[-1].split()[0]
            raise ConfigError(
                f"few-shot example {name!r} scores {result['total_reward']:.2f} under these reward settings "
                f"({result['stage']}: {result['reason']}); check the OCAML_* limits and the sandbox"
            )


def prompt_token_count(tokenizer, messages: list[dict]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fitting_prompts(
    problems: list[dict], tokenizer, cfg: TrainConfig, source: str, note: Callable[[str], None]
):
    """(problem, chat messages) for every problem whose prompt fits GRPO_MAX_PROMPT; the rest counted."""
    fitting = []
    for p in problems:
        messages = build_prompt_messages(p["problem"], few_shot=cfg.few_shot)
        if prompt_token_count(tokenizer, messages) <= cfg.max_prompt_length:
            fitting.append((p, messages))
    dropped = len(problems) - len(fitting)
    note(
        f"dataset: {len(fitting)} problems from {source}; {dropped} dropped as longer than "
        f"GRPO_MAX_PROMPT={cfg.max_prompt_length} tokens"
    )
    if not fitting:
        raise ConfigError(f"GRPO_MAX_PROMPT={cfg.max_prompt_length}: no problem of {source} fits; raise it")
    return fitting


def build_train_dataset(problems: list[dict], tokenizer, cfg: TrainConfig, note: Callable[[str], None]):
    """The rows TRL sees: chat `prompt` plus the columns the reward reads; prompts over the limit dropped."""
    from datasets import Dataset

    rows = [
        {"prompt": messages, "problem_id": p["id"], "problem": p["problem"], "tests": p["tests"]}
        for p, messages in fitting_prompts(problems, tokenizer, cfg, cfg.training_dataset, note)
    ]
    return Dataset.from_list(rows)


def sft_answer(problem: dict) -> str:
    """The reference solution as the answer the reward pays for: one fenced block with the complete
    definition (the problem's signature line unless the solution has its own), ending with END."""
    parsed = parse_problem(problem["problem"])
    code = problem["solution"].strip("\n").rstrip()
    if own_definition(code, parsed.function) is None:  # the reward's own reading of "defines f itself"
        code = f"{parsed.signature}\n{code}"
    return f"```ocaml\n{code}\n{END_MARKER}\n```"


def build_sft_dataset(problems: list[dict], tokenizer, cfg: TrainConfig, note: Callable[[str], None]):
    """Prompt-completion rows for TRL's SFTTrainer: GRPO's chat prompt and the reference answer. Answers
    longer than GRPO_MAX_COMPLETION tokens (GRPO could never sample them) are skipped and counted."""
    from datasets import Dataset

    source = cfg.sft_dataset or cfg.training_dataset
    rows, too_long = [], 0
    for p, messages in fitting_prompts(problems, tokenizer, cfg, source, note):
        answer = sft_answer(p)
        if len(tokenizer(answer, add_special_tokens=False)["input_ids"]) >= cfg.max_completion_length:
            too_long += 1
            continue
        rows.append({"prompt": messages, "completion": [{"role": "assistant", "content": answer}]})
    if too_long:
        note(
            f"sft: {too_long} answers dropped as longer than GRPO_MAX_COMPLETION={cfg.max_completion_length}"
        )
    if not rows:
        raise ConfigError(f"SFT_DATASET={source!r}: no problem with a solution that fits the length limits")
    return Dataset.from_list(rows)
