"""``sluice`` flag errors: one line naming the flag and its rule, exit code 2, nothing started."""

from __future__ import annotations

import pytest

from sluice.cli import main


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--metrics-config", "summary_quantiles=abc"],
            "argument --metrics-config: summary_quantiles: 'abc' has no ':'",
        ),
        (["--metrics-config", "summary_quantiles=2:0.1"], "the quantile must be in [0, 1]"),
        (["--gateway-processes", "0"], "argument --gateway-processes: expected a whole number"),
        (["--gateway-processes", "-1"], "expected a whole number >= 1, got '-1'"),
        (["--cache-config", "redis,host=x"], "only the 'local' cache is served"),
        (["--cache-config", "local,size=big"], "size must be a whole number of bytes"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(argv: list[str], words: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--model-repository", "/nonexistent", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("sluice serve: error: ") and words in err
    assert err.rstrip().endswith("(see 'sluice serve --help')")
