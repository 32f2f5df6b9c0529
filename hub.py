"""The Hugging Face hub, when it cannot be reached: how to tell from a library's error, and the offline route
to name instead of transformers' and datasets' own connection errors (a URL and a documentation link)."""

from __future__ import annotations

# make real-model's folder (real_model.MODELS["0.5b"], which imports the loaders that use this module)
REAL_MODEL_FOLDER = "models/qwen2.5-coder-0.5b-instruct-q4_k_m"
OFFLINE_MODEL = (
    f"offline, `make real-model` builds the real Qwen2.5-Coder-0.5B: GRPO_MODEL_ID={REAL_MODEL_FOLDER}"
)
OFFLINE_DATA = "offline, the bundled problems: TRAINING_DATASET=data/problems.jsonl"


def unreachable(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from, says the hub could not be reached (or was switched off
    with HF_HUB_OFFLINE) and nothing was in the cache."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    seen: BaseException | None = err
    while seen is not None:
        # datasets raises a plain ConnectionError ("Couldn't reach ... on the Hub") of its own
        if isinstance(seen, LocalEntryNotFoundError | OfflineModeIsEnabled | ConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unreachable_message(named: str, what: str, offline_route: str) -> str:
    """The one line for a hub id that could not be fetched: what failed (`its tokenizer`), why, and the way
    forward."""
    why = "the Hugging Face hub cannot be reached and it is not cached"
    return f"{named}: cannot load {what}: {why}; {offline_route}"
