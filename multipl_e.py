"""MultiPL-E (the HumanEval and MBPP translations that code-model papers report) as a problem source.

Its rows name the problem in `name` and hold `prompt` (a doc comment and `let f (x : t) : r =`) and `tests`
(`let assertions = let candidate = f in (assert ...); ... ()`): problems.load_problems reads them as it reads
ours. On the hub it is one dataset with a config per benchmark and language and only a `test` split, so a
source may carry them: `nuprl/MultiPL-E:humaneval-ml`, `nuprl/MultiPL-E:mbpp-ml:test`. A local export in
MultiPL-E's own columns (JSONL, JSON or parquet) loads offline like any problems file.

Two things here are MultiPL-E's, not ours:
- Known rendering bugs of its OCaml translator: a negative integer written `(~5)` (its issue #167), a float
  `.5`, a lone `"` in a doc comment, a capitalised parameter or function name, a dict's `(K, V) list`, a
  list of pairs `A * B list`, Python's None as `Some(None)` (the rules below, one per kind). They are
  repaired only when asked (REPAIR_PROBLEMS=1), in the prompt and the tests, each repair counted:
  unrepaired, the benchmark is the one published numbers were measured on; repaired, it measures the model
  rather than the translator.
- Its evaluation protocol (`evaluate.py --protocol multipl-e`): the prompt as a raw continuation without a
  chat template, cut at its stop sequences, sampled as its completion script does. `Protocol` holds its
  settings and `stop_at_stop_sequence` its cut; evaluate.sample_continuations samples with them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# A hub id with a config and an optional split: `owner/name:config[:split]`.
HUB_SOURCE = re.compile(r"^(?P<id>[\w.-]+(?:/[\w.-]+)?):(?P<config>[\w.-]+)(?::(?P<split>[\w.-]+))?$")


@dataclass(frozen=True)
class Protocol:
    """MultiPL-E's sampling, as its completion script (multipl_e/completions.py) and tutorial run it."""

    temperature: float = 0.2
    top_p: float = 0.95
    max_new_tokens: int = 512
    samples: int = 20  # the tutorial's pass@1 estimate; the paper drew 200 per problem
    # The OCaml translator's stop sequences (dataset_builder/humaneval_to_ml.py), also each row's stop_tokens.
    stop: tuple[str, ...] = ("\n\n", "\n(*", "\ntype", "\nlet")


MULTIPL_E = Protocol()
MULTIPL_E_GREEDY = Protocol(temperature=0.0, samples=1)  # greedy decoding: pass@1 from one completion


# --- sources ----------------------------------------------------------------------------------------------


def split_source(source: str) -> tuple[str, str | None, str | None]:
    """(dataset, config, split) of `owner/name:config[:split]`; anything else, an existing path included,
    comes back whole with no config and no split."""
    match = HUB_SOURCE.match(source)
    if match is None or Path(source).expanduser().exists():
        return source, None, None
    return match["id"], match["config"], match["split"]


def choose_split(available: Sequence[str], wanted: str | None, source: str) -> str:
    """The split asked for; else `train`, else the only split there is (MultiPL-E has only `test`).
    ValueError naming the splits when the choice is not clear."""
    if wanted is not None:
        if wanted not in available:
            raise ValueError(f"{source}: no split {wanted!r} (it has {', '.join(available)})")
        return wanted
    if "train" in available:
        return "train"
    if len(available) == 1:
        return available[0]
    raise ValueError(f"{source}: several splits ({', '.join(available)}); name one as ID:CONFIG:SPLIT")


# --- repairs ----------------------------------------------------------------------------------------------
#
# MultiPL-E's OCaml translator (dataset_builder/humaneval_to_ml.py) renders some Python in ways OCaml rejects.
# Each kind of fault has one rule, written for the kind (never for a named problem), that acts only where the
# text as written cannot be right and never inside a string or character literal:
# - NEGATIVE, FLOAT (tests): `(~5)` -> `(-5)`, `(~5).0` -> `(-5.0)`, `.5` -> `0.5` (its issue #167).
# - QUOTE (any comment): a `"` that opens a string OCaml's lexer never sees closed inside the comment (OCaml
#   lexes strings in comments, so the comment never ends) is deleted; only when the text does not lex.
# - CAPITAL (signature, and the function's uses in the tests): a parameter or function named with a capital
#   (`N`, `Strongest_Extension`), which OCaml reads as a constructor, gets a lower-case first letter; never a
#   constructor of the stdlib or one the prompt defines.
# - PAIR_LIST (signature's types): a dict's `(K, V) list` (list takes one parameter) -> `(K * V) list`.
# - TUPLE_LIST (signature's types): `A * B list`, OCaml's `A * (B list)`, where the tests' values at that
#   position are lists of pairs and not pairs -> `(A * B) list` (likewise `option`, `array`).
# - SOME_NONE (tests): Python's None rendered `Some(None)` where the signature's type there is an option of a
#   non-option -> `None`.

NEGATIVE_LITERAL = re.compile(r"\(~(\d+)\)(\.\d*)?")  # `(~5)`, and `(~5).0` where a float was wanted
LEADING_DOT_FLOAT = re.compile(r"(?<![\w.)\]'\"])\.(\d)")  # `.5`, not `x.5`, `a.(5)` or `1.5`
CHAR_LITERAL = re.compile(r"'(?:\\(?:\d{3}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")

NEGATIVE = "negative literal `(~N)`"
FLOAT = "float `.N`"
QUOTE = 'quote `"` in a comment'
CAPITAL = "capitalised name `N`"
PAIR_LIST = "pair list type `(K, V) list`"
TUPLE_LIST = "tuple list type `A * B list`"
SOME_NONE = "None value `Some(None)`"
LITERAL_RULES = ((NEGATIVE, NEGATIVE_LITERAL, r"(-\1\2)"), (FLOAT, LEADING_DOT_FLOAT, r"0.\1"))
KINDS = (NEGATIVE, FLOAT, QUOTE, CAPITAL, PAIR_LIST, TUPLE_LIST, SOME_NONE)

STDLIB_CONSTRUCTORS = frozenset(
    str.split(
        "None Some Ok Error Left Right Not_found Failure Invalid_argument Exit End_of_file Division_by_zero "
        "Sys_error Stack_overflow Out_of_memory Match_failure Assert_failure Undefined_recursive_module "
        "Sys_blocked_io"
    )
)
UNARY_TYPES = ("list", "option", "array")  # one-parameter type constructors the translator writes
BASE_TYPES = ("int", "float", "string", "bool", "char", "unit")
KEYWORDS = frozenset(
    str.split(
        "and as assert begin do done downto else end for fun function if in let match mod land lor lxor lsl "
        "lsr asr of or then to try type when while with"
    )
)
NEGATIONS = ("-", "~-", "~", "-.", "~-.")
TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<str>"(?:\\.|[^"\\])*")
    |(?P<chr>'(?:\\(?:\d{3}|x[0-9a-fA-F]{2}|.)|[^\\'\n])')
    |(?P<tvar>'[A-Za-z_][\w']*)
    |(?P<num>0[xXoObB][0-9a-fA-F_]+|\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d[\d_]*)?|\.\d[\d_]*)
    |(?P<id>[A-Za-z_][\w']*(?:\.[A-Za-z_][\w']*)*)
    |(?P<open>\[\||[(\[{])
    |(?P<close>\|\]|[)\]}])
    |(?P<sep>[;,])
    |(?P<op>[-+*/=<>@^|&:~!?%.$\#`]+)
    |(?P<other>.)""",
    re.X | re.S,
)
SIGNATURE_LET = re.compile(r"^let\s+(?:rec\s+)?[A-Za-z_]", re.M)
ANY: tuple = ("any",)  # a type the rules know nothing of: every value fits it


@dataclass(frozen=True)
class Fix:
    """One repair: its kind, the part it is in (`prompt` or `tests`), the line, and the text as it was."""

    kind: str
    part: str
    line: int
    text: str


def code_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the stretches of OCaml source outside string and character literals and comments,
    so that a repair never touches `"(~5)"` in a string or a comment."""
    start = i = 0
    depth = 0  # comment nesting
    n = len(text)
    while i < n:
        if text.startswith("(*", i):
            if depth == 0 and i > start:
                yield start, i
            depth += 1
            i += 2
        elif depth and text.startswith("*)", i):
            depth -= 1
            i += 2
            start = i
        elif text[i] == '"':  # a string, inside a comment too (OCaml lexes them there)
            if depth == 0 and i > start:
                yield start, i
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            if depth == 0:
                start = i
        elif text[i] == "'" and (char := CHAR_LITERAL.match(text, i)):  # not a type variable's quote
            if depth == 0 and i > start:
                yield start, i
            i = char.end()
            if depth == 0:
                start = i
        else:
            i += 1
    if depth == 0 and start < n:
        yield start, n


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def apply_edits(text: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """The text with each (start, end, replacement) applied; the edits do not overlap."""
    parts, last = [], 0
    for start, end, new in sorted(edits):
        parts += [text[last:start], new]
        last = end
    return "".join([*parts, text[last:]])


# The lexing that OCaml does and the quote rule needs: strings and character literals are lexed inside
# comments too, so a lone `"` in a doc comment swallows the comment's end.


def string_end(text: str, i: int) -> int | None:
    """The index after the string literal opened at i, or None when it never closes."""
    j, n = i + 1, len(text)
    while j < n:
        if text[j] == "\\":
            j += 2
        elif text[j] == '"':
            return j + 1
        else:
            j += 1
    return None


def comment_end(text: str, i: int, *, blind: bool = False) -> int | None:
    """The index after the comment opened at i as OCaml lexes it (nested comments, strings and character
    literals inside), or None when it never ends; `blind` counts the comment marks only."""
    depth, j, n = 0, i, len(text)
    while j < n:
        if text.startswith("(*", j):
            depth, j = depth + 1, j + 2
        elif text.startswith("*)", j):
            depth, j = depth - 1, j + 2
            if depth == 0:
                return j
        elif not blind and text[j] == '"':
            j = string_end(text, j)
            if j is None:
                return None
        elif not blind and text[j] == "'" and (char := CHAR_LITERAL.match(text, j)):
            j = char.end()
        else:
            j += 1
    return None


def lexes(text: str) -> bool:
    """Whether every string and comment of the text ends."""
    i, n = 0, len(text)
    while i < n:
        if text.startswith("(*", i):
            end = comment_end(text, i)
        elif text[i] == '"':
            end = string_end(text, i)
        elif text[i] == "'" and (char := CHAR_LITERAL.match(text, i)):
            end = char.end()
        else:
            end = i + 1
        if end is None:
            return False
        i = end
    return True


def repair_quotes(text: str, part: str) -> tuple[str, list[Fix]]:
    """QUOTE: where the text does not lex, each `"` in a comment whose string would not close before the
    comment's end is deleted (kept when the text would still not lex)."""
    if lexes(text):
        return text, []
    strays, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("(*", i):
            end = comment_end(text, i, blind=True)
            if end is None:
                break
            j = i + 2
            while j < end - 2:
                char = CHAR_LITERAL.match(text, j) if text[j] == "'" else None
                if text[j] == '"':
                    close = string_end(text, j)
                    if close is None or close > end - 2:
                        strays.append(j)
                        close = j + 1
                    j = close
                else:
                    j = char.end() if char else j + 1
            i = end
        elif text[i] == '"':
            close = string_end(text, i)
            if close is None:
                break
            i = close
        else:
            char = CHAR_LITERAL.match(text, i) if text[i] == "'" else None
            i = char.end() if char else i + 1
    repaired = apply_edits(text, [(j, j + 1, "") for j in strays])
    if not strays or not lexes(repaired):
        return text, []
    return repaired, [Fix(QUOTE, part, line_of(text, j), '"') for j in strays]


def repair_literals(text: str, part: str) -> tuple[str, list[Fix]]:
    """NEGATIVE and FLOAT, in code only."""
    edits, fixes = [], []
    for start, end in code_spans(text):
        for kind, pattern, new in LITERAL_RULES:
            for m in pattern.finditer(text, start, end):
                edits.append((m.start(), m.end(), m.expand(new)))
                fixes.append(Fix(kind, part, line_of(text, m.start()), m[0]))
    return apply_edits(text, edits), fixes


# Tokens, values and types: enough OCaml to read the translator's signatures and its tests' values.


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Val:
    """A test's value: int, float, string, char, bool, unit, list, array, tuple, some, none, or other (an
    expression the rules do not read, which fits every type)."""

    kind: str
    start: int
    end: int
    items: tuple = ()


class Reader:
    """The tokens of a text, comments left out, each bracket matched."""

    def __init__(self, text: str):
        self.toks: list[Tok] = []
        i, n = 0, len(text)
        while i < n:
            if text.startswith("(*", i):
                i = comment_end(text, i) or n
                continue
            m = TOKEN.match(text, i)
            assert m is not None and m.lastgroup is not None
            if m.lastgroup != "ws":
                self.toks.append(Tok(m.lastgroup, m[0], m.start(), m.end()))
            i = m.end()
        self.close: dict[int, int] = {}
        stack: list[int] = []
        for k, tok in enumerate(self.toks):
            if tok.kind == "open":
                stack.append(k)
            elif tok.kind == "close" and stack:
                self.close[stack.pop()] = k

    def end(self, k: int) -> int:
        """The index after the atom at k: a token, or a bracketed group."""
        return self.close.get(k, k) + 1

    def split(self, lo: int, hi: int, kind: str, text: str) -> list[tuple[int, int]]:
        parts, k, start = [], lo, lo
        while k < hi:
            if self.toks[k].kind == kind and self.toks[k].text == text:
                parts.append((start, k))
                start = k + 1
            k = self.end(k) if k in self.close else k + 1
        return [*parts, (start, hi)]

    def is_argument(self, k: int) -> bool:
        tok = self.toks[k] if k < len(self.toks) else None
        if tok is None or (tok.kind == "open" and k not in self.close):
            return False
        return tok.kind in ("open", "num", "str", "chr") or (tok.kind == "id" and tok.text not in KEYWORDS)

    def value(self, lo: int, hi: int) -> Val:
        parts = self.split(lo, hi, "sep", ",")
        if len(parts) > 1:
            items = tuple(self.application(a, b) for a, b in parts)
            return Val("tuple", self.toks[lo].start, self.toks[hi - 1].end, items)
        return self.application(lo, hi)

    def application(self, lo: int, hi: int) -> Val:
        if lo >= hi:
            return Val("other", 0, 0)
        atoms, k = [], lo
        while k < hi:
            atoms.append((k, self.end(k)))
            k = self.end(k)
        start, end = self.toks[lo].start, self.toks[hi - 1].end
        first = self.toks[lo]
        if len(atoms) == 1:
            return self.atom(lo, hi)
        if len(atoms) == 2 and first.kind == "id" and first.text == "Some":
            return Val("some", start, end, (self.atom(*atoms[1]),))
        if len(atoms) == 2 and first.kind == "op" and first.text in NEGATIONS:
            number = self.atom(*atoms[1])
            return Val(number.kind if number.kind in ("int", "float") else "other", start, end)
        return Val("other", start, end)

    def atom(self, lo: int, hi: int) -> Val:
        tok = self.toks[lo]
        start, end = tok.start, self.toks[hi - 1].end
        if tok.kind == "open":
            inner = (lo + 1, hi - 1)
            if tok.text == "(":
                return self.value(*inner) if inner[0] < inner[1] else Val("unit", start, end)
            if tok.text in ("[", "[|"):
                parts = [(a, b) for a, b in self.split(*inner, "sep", ";") if a < b]
                kind = "list" if tok.text == "[" else "array"
                return Val(kind, start, end, tuple(self.value(a, b) for a, b in parts))
            return Val("other", start, end)
        if tok.kind == "num":
            hexadecimal = tok.text[1:2] in ("x", "X", "o", "O", "b", "B")
            floating = not hexadecimal and any(c in tok.text for c in ".eE")
            return Val("float" if floating else "int", start, end)
        simple = {"str": "string", "chr": "char"}.get(tok.kind)
        if simple is None and tok.kind == "id":
            simple = {"true": "bool", "false": "bool", "None": "none"}.get(tok.text)
        return Val(simple or "other", start, end)

    def type_of(self, lo: int, hi: int) -> tuple:
        """The type in tokens lo..hi: ("tuple", parts), ("con", name, args) for the stdlib's base types and
        UNARY_TYPES, else ANY."""
        if lo >= hi or any(t.kind == "op" and "->" in t.text for t in self.toks[lo:hi]):
            return ANY
        parts = self.split(lo, hi, "op", "*")
        if len(parts) > 1:
            return ("tuple", tuple(self.type_of(a, b) for a, b in parts))
        first, k = self.toks[lo], self.end(lo)
        if first.text == "(" and lo in self.close:
            args = tuple(self.type_of(a, b) for a, b in self.split(lo + 1, k - 1, "sep", ","))
            kind = args[0] if len(args) == 1 else ("args", args)
        else:
            kind = ("con", first.text, ()) if first.kind == "id" and first.text in BASE_TYPES else ANY
        for tok in self.toks[k:hi]:
            unary = tok.kind == "id" and tok.text in UNARY_TYPES and kind[0] != "args"
            kind = ("con", tok.text, (kind,)) if unary else ANY
        return ANY if kind[0] == "args" else kind


def parse_type(text: str) -> tuple:
    reader = Reader(text)
    return reader.type_of(0, len(reader.toks))


def fits(kind: tuple, value: Val, lenient: bool = False) -> bool:
    """Whether the value can be of the type; `lenient` lets `Some(None)` stand for any option's None."""
    if value.kind == "other" or kind[0] == "any":
        return True
    if kind[0] == "tuple":
        parts = kind[1]
        return (
            value.kind == "tuple"
            and len(value.items) == len(parts)
            and all(fits(t, v, lenient) for t, v in zip(parts, value.items, strict=True))
        )
    name, args = kind[1], kind[2]
    if name == "option":
        if value.kind != "some":
            return value.kind == "none"
        return (lenient and value.items[0].kind == "none") or fits(args[0], value.items[0], lenient)
    if name in ("list", "array"):
        return value.kind == name and all(fits(args[0], item, lenient) for item in value.items)
    return value.kind == name


def misplaced_nones(kind: tuple, value: Val) -> Iterator[Val]:
    """The `Some(None)` values where the type is an option of a known type that is not an option."""
    if kind[0] == "tuple" and value.kind == "tuple" and len(kind[1]) == len(value.items):
        for t, v in zip(kind[1], value.items, strict=True):
            yield from misplaced_nones(t, v)
    elif kind[0] == "con" and kind[1] == "option" and value.kind == "some":
        inner_type, inner = kind[2][0], value.items[0]
        if inner.kind == "none" and inner_type[0] != "any" and inner_type[1:2] != ("option",):
            yield value
        else:
            yield from misplaced_nones(inner_type, inner)
    elif kind[0] == "con" and kind[1] in ("list", "array") and value.kind == kind[1]:
        for item in value.items:
            yield from misplaced_nones(kind[2][0], item)


@dataclass
class Signature:
    """The prompt's final top-level `let f (x : t) ... : r =`, as token indices of its reader."""

    reader: Reader
    let: int
    name: int
    params: list[tuple[int | None, tuple[int, int] | None]]  # (name token, type tokens), None where unread
    result: tuple[int, int] | None

    def types(self) -> list[tuple]:
        read = [self.reader.type_of(*rng) if rng else ANY for _, rng in self.params]
        return [*read, self.reader.type_of(*self.result) if self.result else ANY]

    def annotations(self) -> list[tuple[int, tuple[int, int]]]:
        """(position, type tokens): a parameter's index, or len(params) for the result."""
        found = [(i, rng) for i, (_, rng) in enumerate(self.params) if rng]
        return found + ([(len(self.params), self.result)] if self.result else [])


def signature(prompt: str) -> Signature | None:
    spans = list(code_spans(prompt))
    lets = [m.start() for m in SIGNATURE_LET.finditer(prompt) if any(a <= m.start() < b for a, b in spans)]
    if not lets:
        return None
    reader = Reader(prompt)
    toks, n = reader.toks, len(reader.toks)
    let = next((k for k, tok in enumerate(toks) if tok.start == lets[-1]), n)
    k = let + 2 if let + 1 < n and toks[let + 1].text == "rec" else let + 1
    if k >= n or toks[k].kind != "id":
        return None
    name, k = k, k + 1
    params: list[tuple[int | None, tuple[int, int] | None]] = []
    while k < n and not (toks[k].kind == "op" and toks[k].text in (":", "=")):
        end = reader.end(k)
        typed = toks[k].text == "(" and end - k >= 5 and toks[k + 1].kind == "id" and toks[k + 2].text == ":"
        if typed:
            params.append((k + 1, (k + 3, end - 1)))
        else:
            params.append((k if toks[k].kind == "id" else None, None))
        k = end
    result = None
    if k < n and toks[k].text == ":":
        stop = k + 1
        while stop < n and not (toks[stop].kind == "op" and toks[stop].text == "="):
            stop = reader.end(stop)
        result = (k + 1, stop)
    return Signature(reader, let, name, params, result)


def rename(text: str, old: str, new: str) -> str:
    """`old` renamed `new` where it is a whole name in code (not a module path's part, not a label)."""
    pattern = re.compile(rf"(?<![\w'.`~?]){re.escape(old)}(?![\w'.])")
    return apply_edits(text, [(a, b, pattern.sub(new, text[a:b])) for a, b in code_spans(text)])


def repair_capitals(prompt: str, tests: str) -> tuple[str, str, list[Fix]]:
    """CAPITAL: the signature's capitalised function and parameter names get a lower-case first letter
    (a suffix `_` where that name is taken); the function's uses in the tests follow."""
    sig = signature(prompt)
    if sig is None:
        return prompt, tests, []
    toks = sig.reader.toks
    known = STDLIB_CONSTRUCTORS | {t.text for t in toks[: sig.let] if t.kind == "id" and t.text[:1].isupper()}
    bound = [sig.name, *(k for k, _ in sig.params if k is not None)]
    wrong = [k for k in bound if toks[k].kind == "id" and toks[k].text[:1].isupper()]
    wrong = [k for k in wrong if "." not in toks[k].text and toks[k].text not in known]
    if not wrong:
        return prompt, tests, []
    taken = {t.text for t in toks + Reader(tests).toks if t.kind == "id"}
    renames: dict[str, str] = {}
    fixes = []
    for k in wrong:
        old = toks[k].text
        if old not in renames:
            new = old[0].lower() + old[1:]
            while new in taken:
                new += "_"
            taken.add(new)
            renames[old] = new
            fixes.append(Fix(CAPITAL, "prompt", line_of(prompt, toks[k].start), old))
    function = toks[sig.name].text
    prompt = apply_edits(prompt, [(toks[k].start, toks[k].end, renames[toks[k].text]) for k in wrong])
    if function in renames:
        tests = rename(tests, function, renames[function])
    return prompt, tests, fixes


def repair_pair_lists(prompt: str) -> tuple[str, list[Fix]]:
    """PAIR_LIST: `(K, V) list` in the signature's types (list, option and array take one parameter)."""
    sig = signature(prompt)
    if sig is None:
        return prompt, []
    reader, toks = sig.reader, sig.reader.toks
    edits, fixes = [], []
    for _, (lo, hi) in sig.annotations():
        for k in range(lo, hi):
            close = reader.close.get(k)
            if toks[k].text != "(" or close is None or close + 1 >= hi:
                continue
            if not (toks[close + 1].kind == "id" and toks[close + 1].text in UNARY_TYPES):
                continue
            commas = [b for _, b in reader.split(k + 1, close, "sep", ",")[:-1]]
            if commas:
                written = prompt[toks[k].start : toks[close + 1].end]
                fixes.append(Fix(PAIR_LIST, "prompt", line_of(prompt, toks[k].start), written))
                edits += [(toks[c - 1].end, toks[c + 1].start, " * ") for c in commas]
    return apply_edits(prompt, edits), fixes


def function_calls(tests: str, sig: Signature) -> list[tuple[list[Val], Val | None]]:
    """(arguments, expected value or None) of each call of the function (or its `let candidate = f in`
    alias) with as many arguments as it has parameters, as the translator writes them:
    `(assert ((candidate ARGS) = EXPECTED))`."""
    reader = Reader(tests)
    toks = reader.toks
    function = sig.reader.toks[sig.name].text
    names = {function}
    for k in range(len(toks) - 4):
        window = [t.text for t in toks[k : k + 5]]
        if window[0] == "let" and window[2] == "=" and window[3] == function and window[4] == "in":
            names.add(window[1])
    found = []
    for k, tok in enumerate(toks):
        if tok.kind != "id" or tok.text not in names:
            continue
        args, j = [], k + 1
        while reader.is_argument(j):
            args.append(reader.atom(j, reader.end(j)))
            j = reader.end(j)
        if len(args) != len(sig.params) or not args:
            continue
        expected = None
        inside = k > 0 and reader.close.get(k - 1) == j
        if inside and j + 1 < len(toks) and toks[j + 1].kind == "op" and toks[j + 1].text == "=":
            lo = e = j + 2
            if e < len(toks) and toks[e].kind == "op" and toks[e].text in NEGATIONS:
                e += 1
            while reader.is_argument(e):
                e = reader.end(e)
            expected = reader.application(lo, e) if e > lo else None
        found.append((args, expected))
    return found


def repair_tuple_lists(prompt: str, tests: str) -> tuple[str, list[Fix]]:
    """TUPLE_LIST: a type `A * B list` that the tests' values at its position do not all fit, regrouped as
    `(A * B) list` (or `(A * B list) list` ... for several constructors) when exactly one regrouping fits
    them all."""
    sig = signature(prompt)
    if sig is None:
        return prompt, []
    reader, toks = sig.reader, sig.reader.toks
    tuples = [(i, rng) for i, rng in sig.annotations() if len(reader.split(*rng, "op", "*")) > 1]
    calls = function_calls(tests, sig) if tuples else []
    edits, fixes = [], []
    for position, (lo, hi) in tuples:
        values = [args[position] if position < len(args) else expected for args, expected in calls]
        values = [v for v in values if v is not None and v.kind != "other"]
        parts = reader.split(lo, hi, "op", "*")
        if not values or all(fits(reader.type_of(lo, hi), v, True) for v in values):
            continue
        last_lo, last_hi = parts[-1]
        constructors = []
        for k in range(last_hi - 1, last_lo, -1):
            if not (toks[k].kind == "id" and toks[k].text in UNARY_TYPES):
                break
            constructors.insert(0, k)
        start, end = toks[lo].start, toks[hi - 1].end
        written = prompt[start:end]
        readings = []
        for c in constructors:
            cut = toks[c - 1].end - start
            text = f"({written[:cut]}){written[cut:]}"
            if all(fits(parse_type(text), v, True) for v in values):
                readings.append(text)
        if len(readings) == 1:
            edits.append((start, end, readings[0]))
            fixes.append(Fix(TUPLE_LIST, "prompt", line_of(prompt, start), written))
    return apply_edits(prompt, edits), fixes


def repair_some_nones(prompt: str, tests: str) -> tuple[str, list[Fix]]:
    """SOME_NONE: `Some(None)` in a test's value where the signature's type there is `T option` and T is
    known and no option."""
    sig = signature(prompt) if "None" in tests else None
    if sig is None:
        return tests, []
    types = sig.types()
    misplaced = {}
    for args, expected in function_calls(tests, sig):
        for kind, value in zip(types, [*args, expected], strict=True):
            for bad in misplaced_nones(kind, value) if value else ():
                misplaced[bad.start] = bad
    bad = misplaced.values()
    fixes = [Fix(SOME_NONE, "tests", line_of(tests, v.start), tests[v.start : v.end]) for v in bad]
    return apply_edits(tests, [(v.start, v.end, "None") for v in bad]), fixes


def repair_problem(prompt: str, tests: str) -> tuple[str, str, list[Fix]]:
    """A problem's prompt and tests with every rendering fault the rules know repaired, and the repairs.
    Without a prompt (""), only the rules that need no signature run."""
    prompt, quotes = repair_quotes(prompt, "prompt")
    tests, test_quotes = repair_quotes(tests, "tests")
    prompt, prompt_literals = repair_literals(prompt, "prompt")
    tests, literals = repair_literals(tests, "tests")
    prompt, tests, capitals = repair_capitals(prompt, tests)
    prompt, pairs = repair_pair_lists(prompt)
    prompt, tuples = repair_tuple_lists(prompt, tests)
    tests, nones = repair_some_nones(prompt, tests)
    fixes = quotes + test_quotes + prompt_literals + literals + capitals + pairs + tuples + nones
    return prompt, tests, fixes


def tally(found: Counter) -> Counter:
    """The counts in KINDS' order, so that `describe` names the kinds in one order."""
    return Counter({kind: found[kind] for kind in KINDS if found[kind]})


def repair_tests(tests: str) -> tuple[str, Counter]:
    """The tests alone with the faults repaired that need no prompt, and how many of each were."""
    _, tests, fixes = repair_problem("", tests)
    return tests, tally(Counter(fix.kind for fix in fixes))


def describe(counts: Counter) -> str:
    """`2 negative literals `(~N)`, 1 float `.N``"""
    words = [f"{c} {name.replace(' `', 's `', 1) if c > 1 else name}" for name, c in counts.items()]
    return ", ".join(words) or "nothing"


def repair_problems(problems: list[dict], note: Callable[[str], None] = print) -> tuple[list[dict], Counter]:
    """Problems with their prompt (`problem`, where the row has one) and tests repaired, each repaired
    problem and the totals named through `note`."""
    total: Counter = Counter()
    repaired_problems, out = 0, []
    for problem in problems:
        prompt, tests, fixes = repair_problem(problem.get("problem") or "", problem["tests"])
        if fixes:
            counts = tally(Counter(fix.kind for fix in fixes))
            repaired_problems += 1
            total.update(counts)
            note(f"repaired problem {problem['id']}: {describe(counts)}")
            problem = {**problem, "tests": tests}
            if "problem" in problem:
                problem["problem"] = prompt
        out.append(problem)
    if repaired_problems:
        note(
            f"REPAIR_PROBLEMS: {describe(tally(total))} repaired in {repaired_problems} of "
            f"{len(problems)} problems"
        )
    return out, total


def repair_hint(tests: str, problem: str = "") -> str:
    """For a broken problem's error line: the rendering fault REPAIR_PROBLEMS=1 repairs that the compiler
    meets first, if there is one."""
    fixes = repair_problem(problem, tests)[2]
    if not fixes:
        return ""
    # The compiler stops at its first error: the prompt's before the tests', syntax before types.
    first = min(fixes, key=lambda fix: (fix.kind in (TUPLE_LIST, SOME_NONE), fix.part != "prompt", fix.line))
    return (
        f" ({first.part} line {first.line}: `{first.text}`, a known MultiPL-E rendering bug ({first.kind}); "
        "REPAIR_PROBLEMS=1 repairs it)"
    )


# --- MultiPL-E's protocol ---------------------------------------------------------------------------------


def stop_at_stop_sequence(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """The text up to the first stop sequence, and whether there was one."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
