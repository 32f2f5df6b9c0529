"""The mechanism of the settings (settings.py declares them): a dataclass field made with `setting(...)`
names its env variable, help text and default; this module reads such fields from the env and the CLI.

A field's CLI flag is its env variable in lower case with dashes and without the `GRPO_` prefix
(`GRPO_NUM_GENERATIONS` -> `--num-generations`). Values resolve as flag > env > default, are parsed
by the field's type annotation and checked against its bounds, so a bad value stops with one line
that names the variable. `--help` and the settings table of docs/configuration.md are generated from the same
fields. No torch import here: the reward's CLI uses this module too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class ConfigError(ValueError):
    """A setting has a value we cannot use; the message names the variable and what is expected."""


def setting(
    default: Any,
    env: str,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    strict_low: bool = False,
    choices: Sequence[str] | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A dataclass field with its env variable, help and bounds. `check` returns an error text or None."""
    meta = {
        "env": env,
        "help": help,
        "low": low,
        "high": high,
        "strict_low": strict_low,
        "choices": tuple(choices) if choices else None,
        "check": check,
    }
    return dataclasses.field(default=default, metadata=meta)


def flag_of(env: str) -> str:
    return "--" + env.removeprefix("GRPO_").lower().replace("_", "-")


def _settings(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "env" in f.metadata]


def _base_type(cls: type, f: dataclasses.Field) -> tuple[type, bool]:
    """(scalar type, optional?) from an annotation such as `int`, `float | None`."""
    hint = typing.get_type_hints(cls)[f.name]
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        scalar = next(a for a in args if a is not type(None))
        return scalar, type(None) in args
    return hint, False


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _expected(f: dataclasses.Field, scalar: type, optional: bool) -> str:
    m = f.metadata
    if m["choices"]:
        text = "one of " + ", ".join(m["choices"])
    elif scalar is bool:
        text = "a boolean (1/0, true/false)"
    elif scalar is int:
        text = "an integer"
    elif scalar is float:
        text = "a number"
    else:
        text = "a string"
    bounds = []
    if m["low"] is not None:
        bounds.append(f"{'>' if m['strict_low'] else '>='} {m['low']:g}")
    if m["high"] is not None:
        bounds.append(f"<= {m['high']:g}")
    if bounds:
        text += " " + " and ".join(bounds)
    if optional:
        text += " (or 'none')"
    return text


def parse_value(cls: type, f: dataclasses.Field, raw: str) -> Any:
    """Parse one raw string for field `f`, or raise ConfigError naming its env variable."""
    scalar, optional = _base_type(cls, f)
    m = f.metadata
    name = m["env"]
    expected = _expected(f, scalar, optional)
    text = raw.strip()
    if optional and text.lower() in {"none", ""}:
        return None
    try:
        if scalar is bool:
            if text.lower() not in _TRUE | _FALSE:
                raise ValueError
            value: Any = text.lower() in _TRUE
        elif scalar is int:
            value = int(text)
        elif scalar is float:
            value = float(text)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError
        else:
            value = text
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected {expected}") from None
    if m["choices"] and value not in m["choices"]:
        raise ConfigError(f"{name}={raw!r}: expected {expected}")
    too_low = m["low"] is not None and (value <= m["low"] if m["strict_low"] else value < m["low"])
    too_high = m["high"] is not None and value > m["high"]
    if too_low or too_high:
        raise ConfigError(f"{name}={raw!r}: expected {expected}")
    if m["check"] and (problem := m["check"](value)):
        raise ConfigError(f"{name}={raw!r}: {problem}")
    return value


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One `--flag VALUE` per setting; values stay raw strings so that flags and env parse alike.
    A boolean flag given bare means true (`--stop-on-red-flags`)."""
    for f in _settings(cls):
        _add_flag(parser, cls, f)


def add_argument(parser: argparse.ArgumentParser, cls: type, name: str) -> None:
    """The flag of the one setting `name`, for a tool that takes no other (analyze.py's --monitor-bands)."""
    _add_flag(parser, cls, next(f for f in _settings(cls) if f.name == name))


def _add_flag(parser: argparse.ArgumentParser, cls: type, f: dataclasses.Field) -> None:
    env = f.metadata["env"]
    is_bool = _base_type(cls, f)[0] is bool
    parser.add_argument(
        flag_of(env),
        dest=f.name,
        default=None,
        nargs="?" if is_bool else None,
        const="true" if is_bool else None,
        metavar="VALUE",
        # argparse %-formats help texts; a setting's own "%" is a literal one.
        help=f"{f.metadata['help'].replace('%', '%%')} [env {env}, default {_shown(f.default)}]",
    )


def resolve(cls: type, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None):
    """Build `cls` from flags > env > defaults; returns (config, {field: 'flag'|'env'|'default'})."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in _settings(cls):
        env = f.metadata["env"]
        raw_flag = getattr(args, f.name, None) if args is not None else None
        if raw_flag is not None:
            values[f.name], sources[f.name] = parse_value(cls, f, raw_flag), "flag"
        elif env in environ:
            values[f.name], sources[f.name] = parse_value(cls, f, environ[env]), "env"
        else:
            sources[f.name] = "default"
    return cls(**values), sources


def from_env(cls: type, environ: Mapping[str, str] | None = None):
    """`cls` from env > defaults, for code that has no command line of its own."""
    return resolve(cls, None, environ)[0]


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def markdown_table(cls: type) -> str:
    """The settings table of docs/configuration.md for `cls`."""
    rows = ["| env variable | flag | default | meaning |", "|---|---|---|---|"]
    for f in _settings(cls):
        env = f.metadata["env"]
        help_text = f.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{env}` | `{flag_of(env)}` | `{_shown(f.default)}` | {help_text} |")
    return "\n".join(rows)
