"""Where a model id becomes a config, a tokenizer or a model: a hub id, a local folder, or a `.gguf` file.

A GGUF file (llama.cpp's format; `make real-model` fetches the Qwen2.5-Coder ones) is dequantized on load
into a plain model in bf16, the dtype the hub's Qwen2.5 checkpoints are saved in: transformers keeps a GGUF
model behind its quantizer, which cannot be trained or saved, so the weights move into a model built from
the same config without one. Everything here that loads imports transformers only when called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hub
from envflags import ConfigError
from problems import DATASET_BUILDERS

GGUF_SUFFIX = ".gguf"
GGUF_DTYPE = "bfloat16"


def is_gguf(model_id: str) -> bool:
    return Path(model_id).suffix.lower() == GGUF_SUFFIX


def gguf_location(model_id: str) -> tuple[str, str]:
    """(folder, file name) of a GGUF file, as transformers' `from_pretrained(folder, gguf_file=name)` takes
    them; ConfigError when there is no such file."""
    path = Path(model_id).expanduser()
    if not path.is_file():
        raise ConfigError(f"{model_id}: no such GGUF file")
    return str(path.resolve().parent), path.name


def _source(model_id: str) -> tuple[str, dict[str, Any]]:
    """What `from_pretrained` takes for this id: the folder and `gguf_file` for a GGUF file."""
    if is_gguf(model_id):
        folder, name = gguf_location(model_id)
        return folder, {"gguf_file": name}
    return model_id, {}


def _cannot_load(model_id: str, what: str, err: BaseException, setting: str | None = None) -> ConfigError:
    named = f"{setting}={model_id!r}" if setting else model_id
    if hub.unreachable(err):
        return ConfigError(hub.unreachable_message(named, f"its {what}", hub.OFFLINE_MODEL))
    reason = " ".join(str(err).split())  # transformers' messages span lines; ours are one line
    return ConfigError(f"{named}: cannot load its {what} ({reason})")


def load_config(model_id: str, setting: str | None = None):
    """The model's transformers config, without loading weights (a GGUF's read from its metadata, as the
    config of the bf16 model load_causal_lm makes of it). `setting` names where the id came from in an
    error."""
    from transformers import AutoConfig

    source, extra = _source(model_id)
    try:
        config = AutoConfig.from_pretrained(source, **extra)
    except (OSError, ValueError) as err:
        raise _cannot_load(model_id, "config", err, setting) from None
    if extra:
        config.quantization_config = None
        del config.quantization_config
        config.dtype = GGUF_DTYPE
    return config


def load_tokenizer(model_id: str, setting: str | None = None):
    """The model's tokenizer with its chat template; a pad token for batches where it has none. `setting`
    names where the id came from in an error."""
    from transformers import AutoTokenizer

    source, extra = _source(model_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **extra)
    except (OSError, ValueError) as err:
        raise _cannot_load(model_id, "tokenizer", err, setting) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(model_id: str, dtype: Any = "auto"):
    """The model, in eval mode on the CPU: as saved (dtype `auto`) for a hub id or folder, and for a GGUF
    file dequantized into a plain model in bf16 (or `dtype`) whose `name_or_path` is the file, so that an
    adapter trained on it names the file as its base."""
    from transformers import AutoModelForCausalLM, GgufConfig

    source, extra = _source(model_id)
    try:
        if not extra:
            return AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        dtype = GGUF_DTYPE if dtype == "auto" else dtype
        packed = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, quantization_config=GgufConfig(dequantize=True), **extra
        )
    except (OSError, ValueError) as err:
        raise _cannot_load(model_id, "weights", err) from None
    config = packed.config
    config.quantization_config = None
    del config.quantization_config
    # Every key of the dequantized state dict matches the plain model's; nothing is initialised at random.
    model = type(packed).from_pretrained(None, config=config, state_dict=packed.state_dict(), dtype=dtype)
    model.name_or_path = model.config.name_or_path = str(Path(model_id).expanduser().resolve())
    return model.eval()


def weights_note(model_id: str, base: str | None = None) -> str | None:
    """What a figure measured on this model (or adapter, on its base) must say about its weights: the GGUF
    files and `make real-model`'s folders hold Q4_K_M weights, dequantized."""
    path = Path(model_id).expanduser()
    if (path / "adapter_config.json").is_file():
        config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        named = base or config.get("base_model_name_or_path")
        return weights_note(named) if named else None
    if is_gguf(model_id):
        return "GGUF weights, dequantized: not the hub's bf16 model"
    provenance = path / "real_model.json"
    if provenance.is_file():
        quantization = json.loads(provenance.read_text(encoding="utf-8")).get("quantization", "quantized")
        return f"{quantization} weights, dequantized (make real-model): not the hub's bf16 model"
    return None


def looks_local(name: str) -> bool:
    """A hub id is `owner/name`; anything that exists, or reads like a path or a file name (a dataset's or a
    GGUF file's), is local."""
    return (
        Path(name).expanduser().exists()
        or name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or Path(name).suffix in DATASET_BUILDERS
        or is_gguf(name)
    )


def load_base(model_id: str):
    """Model (on the GPU when there is one, eval mode) and tokenizer, with a pad token for batches."""
    import torch

    path = Path(model_id).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        raise ConfigError(f"{model_id}: no config.json (model) or adapter_config.json (adapter) there")
    if not path.exists() and looks_local(model_id):
        raise ConfigError(f"{model_id}: no such model folder or file")
    tokenizer = load_tokenizer(model_id)
    model = load_causal_lm(model_id)
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval(), tokenizer


def with_adapter(model, adapter_dir: Path):
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    except (OSError, ValueError, RuntimeError) as err:
        raise ConfigError(f"{adapter_dir}: cannot load the adapter ({' '.join(str(err).split())})") from None


def adapter_base(adapter_dir: Path) -> str:
    """The base model an adapter folder names (PEFT's base_model_name_or_path)."""
    try:
        base = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{adapter_dir}/adapter_config.json: not JSON ({err.msg})") from None
    if not base.get("base_model_name_or_path"):
        raise ConfigError(f"{adapter_dir}/adapter_config.json names no base model: pass --base")
    return base["base_model_name_or_path"]


def load_model(spec: str, base: str | None = None):
    """A model id or folder, or a PEFT adapter folder on its own base model (or on `base`)."""
    path = Path(spec).expanduser()
    if (path / "adapter_config.json").is_file():
        model, tokenizer = load_base(base or adapter_base(path))
        return with_adapter(model, path), tokenizer
    return load_base(spec)
