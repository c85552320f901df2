"""Comments and docstrings cite only what the repository holds and state rules, not history.

Every Python file of the project is read as source. Two kinds of text fail:

* a citation of a document that is not in the repository (the protocol, style and design
  notes kept outside it, or other notes beside the repository); the facts the code relies
  on are written under ``docs/`` and cited from there, or cited by Triton's own sources;
* history in a comment or a docstring: dates of runs, numbered sessions, "fresh-user" or
  retest reports, A/B rounds, before -> after timings. Those belong in commit messages and
  ``docs/performance.md``; a comment states the rule and its reason in the present tense.

One test per file, so a failure names the file and the offending lines.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]

#: The folders whose Python files are checked.
FOLDERS = (
    "api",
    "broker",
    "gpu_workers",
    "job_workers",
    "batching",
    "repository",
    "sluice",
    "tests",
    "benchmarks",
    "examples",
    "scripts",
)

#: A document outside the repository, cited anywhere in a file (comment, docstring or
#: string). The benchmark harness runs the peers' set-up scripts kept in the bench folder
#: beside the repository: those are commands it executes, not documents it cites, so that
#: one folder is allowed. The names are assembled so that this file cites none of them.
_TEAM = "sha" + "red"
_NOTE = {name: name + "." + "md" for name in ("PROTOCOL", "STYLE")}
_BESIDE = "../" + _TEAM

CITATIONS = (
    re.compile(r"\b(?:PROTOCOL|STYLE|DESIGN)" + r"\.md\b"),
    re.compile(r"\bdesign card\b", re.IGNORECASE),
    re.compile(r"\b" + _TEAM + r"/(?:reference|hooks|notes)\b|\b" + _TEAM + r"/README\b"),
    re.compile(r"\.\./" + _TEAM + r"/(?!bench/)"),
    # A bare section number ("§6.3") of the protocol notes.
    re.compile(r"§\s?\d"),
)

_ORDINALS = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
    r"twentieth|twenty-\w+|thirtieth|thirty-\w+"
)

#: History narration, looked for in comments and docstrings only.
NARRATION = (
    re.compile(r"\bfresh[- ]user\b", re.IGNORECASE),
    re.compile(r"\bretest(?:ed)? report\b", re.IGNORECASE),
    re.compile(rf"\b(?:{_ORDINALS})(?:'s)? (?:session|round|work log)s?\b", re.IGNORECASE),
    re.compile(r"\b(?:last|previous|earlier) session\b", re.IGNORECASE),
    # A date of a run: 2026-12-02.
    re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    re.compile(r"\bA/B\b"),
    re.compile(r"\bfailed once\b", re.IGNORECASE),
    re.compile(r"\bbefore this change\b", re.IGNORECASE),
    # A before -> after timing: "2.43 s -> 1.12 s", "28 s → 8 s".
    re.compile(r"\d\s*(?:µs|us|ms|s)\s*(?:->|→)\s*\d"),
)


def _files() -> Iterator[Path]:
    """Every checked file but this one, whose examples hold the patterns on purpose."""
    for folder in FOLDERS:
        yield from (path for path in sorted((ROOT / folder).rglob("*.py")) if path != HERE)


def _prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every docstring or bare string statement."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for offset, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + offset, line


def _problems(source: str) -> list[str]:
    found = [
        f"line {number}: cites {match.group(0)!r}: {line.strip()}"
        for number, line in enumerate(source.splitlines(), start=1)
        for pattern in CITATIONS
        if (match := pattern.search(line))
    ]
    found += [
        f"line {number}: narrates history ({match.group(0)!r}): {text.strip()}"
        for number, text in _prose(source)
        for pattern in NARRATION
        if (match := pattern.search(text))
    ]
    return found


@pytest.mark.parametrize("path", list(_files()), ids=lambda path: str(path.relative_to(ROOT)))
def test_comments_cite_the_repository_and_state_no_history(path: Path) -> None:
    problems = _problems(path.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "text",
    [
        f"# see {_NOTE['PROTOCOL']} 5.1",
        f'"""Rules ({_NOTE["STYLE"]} §5)."""',
        "# the design card says so",
        "# concatenated as in §6.3 step 3",
        f"# notes in {_BESIDE}/reference/x.md",
        "# a fresh-user finding",
        "# p50 -10 µs, eighth session",
        "# measured 2026-12-01",
        "# import 2.43 s -> 1.12 s",
        "# A/B rounds against the old code",
    ],
)
def test_the_patterns_catch_what_they_are_for(text: str) -> None:
    assert _problems(text + "\n")


@pytest.mark.parametrize(
    "text",
    [
        "# Triton model_config.proto (docs/reference/model-configuration.md)",
        f"# runs bash {_BESIDE}/bench/setup_anchors.sh first",
        "x = '2026-12-01'  # a date in data, not in prose",
        "# a redis-server in a session of its own",
        "# one write per 16 answers",
    ],
)
def test_the_patterns_leave_plain_text_alone(text: str) -> None:
    assert not _problems(text + "\n")
