"""Every flag of tritonserver 2.51 is understood by ``sluice serve``: implemented, or
accepted with a warning that it has no effect (never ``unrecognized arguments``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sluice.cli_parser import build_parser
from sluice.inert_flags import INERT_FLAGS, warn_inert_flags

FLAGS = Path(__file__).resolve().parents[1] / "assets" / "tritonserver-2.51-flags.txt"

#: values that pass the checks of flags Sluice implements (others get a generic one)
SAMPLES = {
    "--model-control-mode": "explicit",
    "--log-format": "ISO8601",
    "--http-restricted-api": "health,api-key=secret",
    "--grpc-restricted-protocol": "health,api-key=secret",
    "--grpc-infer-response-compression-level": "low",
    "--metrics-config": "summary_latencies=true",
    "--cache-config": "local,size=1048576",
    "--load-model": "digits",
    "--log-file": "/dev/null",  # opened when parsed
    "--trace-config": "triton,file=/tmp/trace.json",
    "--trace-file": "/tmp/trace.json",
    "--trace-level": "TIMESTAMPS",
}
BY_FORM = {"<boolean>": "true", "<integer>": "1", "<float>": "1.5"}


def _flags() -> list[tuple[str, str]]:
    lines = [line.split(" ", 1) for line in FLAGS.read_text().splitlines()]
    return [(parts[0], parts[1] if len(parts) > 1 else "") for parts in lines if parts[0] != "#"]


def test_the_flag_list_is_tritonserver_2_51s() -> None:
    names = [flag for flag, _ in _flags()]
    assert len(names) == 87 and len(set(names)) == 87
    assert {"--backend-config", "--pinned-memory-pool-byte-size", "--model-repository"} <= set(
        names
    )


@pytest.mark.parametrize(("flag", "form"), _flags())
def test_every_tritonserver_flag_parses(flag: str, form: str) -> None:
    argv = ["serve", "--model-repository", "/models"]
    if form:  # --help and --disable-auto-complete-config take no value
        argv.append(f"{flag}={SAMPLES.get(flag, BY_FORM.get(form, 'name,key=value'))}")
    else:
        argv.append(flag)
    if flag == "--help":
        with pytest.raises(SystemExit) as info:
            build_parser().parse_known_args(argv)
        assert info.value.code == 0
        return
    args, rest = build_parser().parse_known_args(argv)
    assert rest == [], f"{flag}: unrecognized"
    assert args.command == "serve"


def test_inert_flags_warn_once_each_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(
        [
            "serve", "--model-repository", "/m",
            "--backend-config=python,shm-default-byte-size=1048576",
            "--backend-config", "onnxruntime,default-max-batch-size=4",
            "--pinned-memory-pool-byte-size=0",
        ]
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="sluice"):
        lines = warn_inert_flags(args)
    assert lines == [
        "--backend-config=python,shm-default-byte-size=1048576 has no effect in Sluice: "
        + INERT_FLAGS["--backend-config"],
        "--backend-config=onnxruntime,default-max-batch-size=4 has no effect in Sluice: "
        + INERT_FLAGS["--backend-config"],
        "--pinned-memory-pool-byte-size=0 has no effect in Sluice: "
        + INERT_FLAGS["--pinned-memory-pool-byte-size"],
    ]
    assert [r.getMessage() for r in caplog.records] == lines
