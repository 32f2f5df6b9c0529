"""The documentation stays navigable and true: README.md is short, every relative link and anchor
resolves, every page of docs/ is linked from README.md, and README's settings overview matches TrainConfig
and .envrc."""

import re
from pathlib import Path

import pytest

import envflags
from settings import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250  # issue 15: a newcomer reads it in five minutes; the detail lives in docs/

FENCED = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.M)


def prose(path: Path) -> str:
    """The page without its fenced code blocks, whose brackets are code, not links."""
    return FENCED.sub("", path.read_text(encoding="utf-8"))


def anchors(path: Path) -> set[str]:
    """The ids GitHub gives the page's headings: lower case, punctuation dropped, spaces as dashes, and a
    -1, -2... suffix on a repeated one."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in HEADING.findall(prose(path)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        ids.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return ids


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file is missing, or whose #anchor names no heading there."""
    broken = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#two-words) [gone](nope.md) [bad](a.md#three) [web](https://x.org/y) [self](#here)\n"
        "## Here\n```\n[in code](ignored.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["nope.md: no such file", "a.md#three: no heading #three in a.md"]


def test_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail to a page of docs/"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(README)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], "link these from README.md"


def overview_rows() -> list[list[str]]:
    """The rows of README's settings overview: env variable, default, .envrc value, what it does."""
    text = README.read_text(encoding="utf-8")
    table = re.search(r"^\| env variable \| default \| `\.envrc` \|.*?\n((?:\|.*\n)+)", text, re.M)
    assert table, "README.md lacks the settings overview table"
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.group(1).splitlines()
    ]
    return [row for row in rows if not set(row[0]) <= set("-")]


def envrc_values() -> dict[str, str]:
    exports = re.findall(r"^export (\w+)=(\S+)", (ROOT / ".envrc").read_text(encoding="utf-8"), re.M)
    return dict(exports)


def test_readme_settings_overview_matches_the_settings_and_envrc() -> None:
    defaults = {f.metadata["env"]: f"`{envflags._shown(f.default)}`" for f in envflags._settings(TrainConfig)}
    envrc = envrc_values()
    rows = overview_rows()
    assert len(rows) >= 8
    for env_cell, default, envrc_value, _ in rows:
        env = env_cell.strip("`")
        assert env in defaults, f"README overview: {env} is not a setting"
        assert default == defaults[env], f"README overview: {env}'s default is {defaults[env]}"
        assert envrc_value == (f"`{envrc[env]}`" if env in envrc else ""), f"README overview: {env} in .envrc"
