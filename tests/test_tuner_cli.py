"""`prefill-gate tune` and `serve --autotune-*` flags: a bad value is a one-line error naming the flag."""

from __future__ import annotations

import io

import pytest

from control.cli import build_parser
from control.host.autotune import check_autotune_args
from control.tune_cli import tune_main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--ttft-p99 is required (seconds)"),
        (["--ttft-p99", "1"], "--itl-p99 is required (seconds)"),
        (["--ttft-p99", "0", "--itl-p99", "0.2"], "--ttft-p99 must be a number of seconds > 0, got 0.0"),
        (["--ttft-p99", "nan", "--itl-p99", "0.2"], "--ttft-p99 must be a number of seconds > 0, got nan"),
        (["--ttft-p99", "1", "--itl-p99", "0.2", "--dwell-rounds", "0"], "--dwell-rounds must be >= 1, got 0"),
        (["--ttft-p99", "1", "--itl-p99", "0.2", "--respect-manual", "-1"], "--respect-manual must be >= 0, got -1.0"),
        (["--ttft-p99", "1", "--itl-p99", "0.2", "--max-changes-per-min", "0"], "--max-changes-per-min must be > 0"),
    ],
)
def test_tune_refuses_bad_flags_before_connecting(argv, message):
    parser, _ = build_parser()
    err = io.StringIO()
    assert tune_main(parser.parse_args(["tune", "--target", "127.0.0.1:1", *argv]), io.StringIO(), err) == 2
    assert err.getvalue().startswith("prefill-gate tune: error: ") and message in err.getvalue()


def test_an_unreadable_token_file_is_an_error_not_a_traceback(tmp_path):
    parser, _ = build_parser()
    ns = parser.parse_args(["tune", "--ttft-p99", "1", "--itl-p99", "0.2", "--token-file", str(tmp_path / "nope")])
    err = io.StringIO()
    assert tune_main(ns, io.StringIO(), err) == 1 and err.getvalue().startswith("error: ")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    ns.token_file = str(empty)
    assert tune_main(ns, io.StringIO(), err) == 1 and "holds no token" in err.getvalue()


def test_serve_refuses_half_an_slo_and_the_local_policy():
    parser, _ = build_parser()
    ns = parser.parse_args(["serve", "--executor", "sim", "--autotune-ttft-p99", "1"])
    with pytest.raises(ValueError, match="--autotune-itl-p99 is required"):
        check_autotune_args(ns)
    ns = parser.parse_args(
        ["serve", "--autotune-ttft-p99", "1", "--autotune-itl-p99", "0.2", "--prefill-decode-interval", "4"]
    )
    with pytest.raises(ValueError, match="cannot run with --prefill-decode-interval"):
        check_autotune_args(ns)
    check_autotune_args(parser.parse_args(["serve"]))  # no SLO: no tuner, nothing to check
