"""The README and docs/ link only to what the repository holds, and cite no team notes.

Every relative link in ``README.md``, ``docs/**/*.md`` and ``benchmarks/**/*.md`` must
name a file or folder of the repository; a ``#anchor`` on a Markdown page must name one of
its headings (GitHub's slugs). External ``http(s)``/``mailto`` links are not fetched. No
page may cite the protocol, style or design notes kept outside the repository: what users
need is written in ``docs/``, and the docs cite Triton's and KServe's own pages.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pages() -> list[Path]:
    pages = [ROOT / "README.md"]
    for folder in ("docs", "benchmarks"):
        pages += sorted((ROOT / folder).rglob("*.md"))
    return [page for page in pages if page.is_file()]


#: ``[text](target)`` and ``[text](target "title")``; images too.
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: ``[label]: target`` reference definitions.
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)

#: Team notes outside the repository that no page may cite (their names are built here, so
#: that this file does not cite them either).
_NOTE_NAMES = ("PROTOCOL", "STYLE", "DESIGN")
_NOTES = re.compile(rf"(?<![\w-])(?:{'|'.join(_NOTE_NAMES)})\.md\b|\b(?i:{'design' + ' card'})\b")


def _prose(text: str) -> str:
    """The page without fenced code blocks and code spans (examples are not links)."""
    text = _FENCE.sub("", text)
    return _CODE_SPAN.sub("", text)


def links(text: str) -> list[str]:
    """Every link target in a Markdown text, outside code."""
    prose = _prose(text)
    return [m.group(1) for m in _INLINE.finditer(prose)] + [
        m.group(1) for m in _REFERENCE.finditer(prose)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors of a Markdown page's headings (repeats get ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for match in _HEADING.finditer(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def problems(page: Path, text: str | None = None) -> list[str]:
    """What is wrong with the links and citations of ``page`` (its text, or ``text`` as if
    it were the page's)."""
    if text is None:
        text = page.read_text(encoding="utf-8")
    found = [f"cites {m.group(0)!r}" for m in _NOTES.finditer(text)]
    for target in links(text):
        if _EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        try:
            resolved.relative_to(ROOT)
        except ValueError:
            found.append(f"{target}: outside the repository")
            continue
        if not resolved.exists():
            found.append(f"{target}: no such file")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            found.append(f"{target}: no heading with anchor '#{anchor}'")
    return found


@pytest.mark.parametrize("page", _pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_links_resolve_and_no_team_notes_are_cited(page: Path) -> None:
    found = problems(page)
    assert not found, "\n".join(found)


def test_the_docs_exist() -> None:
    assert (ROOT / "docs" / "README.md").is_file()
    assert len(_pages()) > 10


def test_link_extraction() -> None:
    text = (
        'See [a](docs/a.md#x), [b](<b.md>), ![img](i.png "t"), [ext](https://x.y/z),\n'
        "`[not](code.md)` and\n```\n[also not](fenced.md)\n```\n[ref]: ref/target.md\n"
    )
    assert links(text) == ["docs/a.md#x", "b.md", "i.png", "https://x.y/z", "ref/target.md"]


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("The path of a request", "the-path-of-a-request"),
        ("`ModelInfer`", "modelinfer"),
        ("Metrics, statistics and the dashboard", "metrics-statistics-and-the-dashboard"),
        ("Start-up checks and exit codes", "start-up-checks-and-exit-codes"),
        ("`sluice serve`", "sluice-serve"),
        (
            "MLP at 32 clients: throughput at least Triton's",
            "mlp-at-32-clients-throughput-at-least-tritons",
        ),
    ],
)
def test_slug(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_broken_link_a_bad_anchor_and_a_citation_are_found() -> None:
    page = ROOT / "docs" / "probe.md"  # never written: its text is passed in
    text = (
        "[gone](nowhere.md) [bad anchor](README.md#no-such-heading) [up](../../x.md)\n"
        "[fine](README.md#reference) see " + _NOTE_NAMES[0] + ".md 1.3\n"
    )
    found = problems(page, text)
    assert found == [
        f"cites '{_NOTE_NAMES[0]}.md'",
        "nowhere.md: no such file",
        "README.md#no-such-heading: no heading with anchor '#no-such-heading'",
        "../../x.md: outside the repository",
    ]
