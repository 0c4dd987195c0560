"""ServerArgs: flags, validation on every read, validated copies (rules C1-C4)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import ServerArgs


def parse(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def test_flags_are_kebab_case_and_default_unset():  # rule C1
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    text = parser.format_help()
    for flag in (
        "--prefill-attempt-interval",
        "--prefill-any-attempt-interval",
        "--prefill-decode-interval",
        "--disaggregation-mode",
        "--dp-size",
        "--enable-dp-attention",
        "--max-num-seqs",
        "--chunked-prefill-size",
        "--enable-mixed-prefill-decode",
    ):
        assert flag in text
    args = parse([])
    assert args.prefill_attempt_interval is None and args.prefill_any_attempt_interval is None
    assert args.prefill_delay is None


def test_flags_parse_into_the_gate():  # rule C1, C2
    args = parse(["--prefill-attempt-interval", "4", "--prefill-any-attempt-interval", "16", "--dp-size", "2"])
    delay = args.prefill_delay
    assert (delay.attempt_interval, delay.any_interval) == (4, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delay.attempt_interval = 5  # type: ignore[misc]


INVALID = [
    ({"prefill_attempt_interval": 4}, ["--prefill-any-attempt-interval", "--prefill-attempt-interval"]),
    ({"prefill_any_attempt_interval": 4}, ["--prefill-attempt-interval", "--prefill-any-attempt-interval"]),
    ({"prefill_attempt_interval": 0, "prefill_any_attempt_interval": 4}, ["--prefill-attempt-interval", "0"]),
    ({"prefill_attempt_interval": 2, "prefill_any_attempt_interval": -1}, ["--prefill-any-attempt-interval", "-1"]),
    ({"prefill_attempt_interval": 2.5, "prefill_any_attempt_interval": 4}, ["--prefill-attempt-interval", "2.5"]),
    ({"prefill_attempt_interval": True, "prefill_any_attempt_interval": 4}, ["--prefill-attempt-interval"]),
    (
        {"prefill_attempt_interval": 8, "prefill_any_attempt_interval": 4},
        ["--prefill-any-attempt-interval (4)", "--prefill-attempt-interval (8)"],
    ),
    (
        {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 4, "disaggregation_mode": "prefill"},
        ["--disaggregation-mode", "'prefill'"],
    ),
    (
        {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 4, "disaggregation_mode": "decode"},
        ["--disaggregation-mode", "'decode'"],
    ),
    (
        {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 4, "prefill_decode_interval": 3},
        ["--prefill-decode-interval (3)"],
    ),
]


@pytest.mark.parametrize(("values", "names"), INVALID)
def test_invalid_gate_is_refused_at_construction(values, names):  # rule C2
    with pytest.raises(ValueError) as info:
        ServerArgs(**values)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(("values", "names"), INVALID)
def test_invalid_gate_is_refused_at_validate_and_next_read(values, names):  # rule C2
    args = ServerArgs()
    for key, value in values.items():
        setattr(args, key, value)  # a programmatic change bypasses construction
    with pytest.raises(ValueError) as at_validate:
        args.validate()
    with pytest.raises(ValueError) as at_read:
        _ = args.prefill_delay
    assert str(at_validate.value) == str(at_read.value)
    for name in names:
        assert name in str(at_read.value)


def test_programmatic_clear_of_one_interval_is_caught_at_next_read():  # rule C2
    args = ServerArgs(prefill_attempt_interval=2, prefill_any_attempt_interval=4)
    assert args.prefill_delay is not None
    args.prefill_any_attempt_interval = None
    with pytest.raises(ValueError, match="--prefill-any-attempt-interval"):
        _ = args.prefill_delay


def test_replace_returns_a_validated_copy_and_changes_nothing_on_error():  # rule C3
    args = ServerArgs(prefill_attempt_interval=2, prefill_any_attempt_interval=4)
    new = args.replace(prefill_attempt_interval=3, prefill_any_attempt_interval=9)
    assert new.prefill_delay.any_interval == 9
    assert args.prefill_delay.any_interval == 4
    with pytest.raises(ValueError, match="must be >="):
        args.replace(prefill_attempt_interval=9, prefill_any_attempt_interval=3)
    assert (args.prefill_attempt_interval, args.prefill_any_attempt_interval) == (2, 4)
    with pytest.raises(ValueError, match="unknown server argument"):
        args.replace(prefill_interval=3)


def test_clearing_both_intervals_turns_the_gate_off():  # rule C3
    args = ServerArgs(prefill_attempt_interval=2, prefill_any_attempt_interval=4)
    assert args.replace(prefill_attempt_interval=None, prefill_any_attempt_interval=None).prefill_delay is None


def test_max_batch_size_divides_by_dp_size_only_with_dp_attention():  # rule C4
    assert ServerArgs(max_num_seqs=64, dp_size=4, enable_dp_attention=True, executor="sim").max_batch_size == 16
    assert ServerArgs(max_num_seqs=64, dp_size=4, executor="sim").max_batch_size == 64
    with pytest.raises(ValueError, match=r"--max-num-seqs \(3\) must be >= --dp-size \(4\)"):
        ServerArgs(max_num_seqs=3, dp_size=4, enable_dp_attention=True, executor="sim")


def test_other_bad_values_name_their_flag():
    with pytest.raises(ValueError, match="--page-size"):
        ServerArgs(page_size=0)
    with pytest.raises(ValueError, match="--executor"):
        ServerArgs(executor="tpu")
    with pytest.raises(ValueError, match="--model-experts"):
        ServerArgs(dp_size=3, executor="torch")
    with pytest.raises(ValueError, match="--chunked-prefill-size"):
        ServerArgs(enable_mixed_prefill_decode=True, chunked_prefill_size=64, max_num_seqs=64)


intervals = st.one_of(st.none(), st.integers(-3, 40), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3))


@given(attempt=intervals, any_=intervals, decode=st.one_of(st.none(), st.integers(-2, 5)))
def test_fuzz_every_read_agrees_with_the_rules(attempt, any_, decode):  # rule C2
    def expected_ok() -> bool:
        ok_int = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
        if decode is not None and not ok_int(decode):
            return False
        if attempt is None and any_ is None:
            return True
        return ok_int(attempt) and ok_int(any_) and any_ >= attempt and decode is None

    try:
        args = ServerArgs(
            prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_, prefill_decode_interval=decode
        )
    except ValueError:
        assert not expected_ok()
        return
    assert expected_ok()
    delay = args.prefill_delay
    assert (delay is None) == (attempt is None and any_ is None)
