"""The all-gather row: one int64 vector per rank (R2's payload)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rows import BOOL_FIELDS, FIELD_NAMES, ROW_WIDTH, UNSET, Row, decode_rows


def row_values() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries(
        {name: (st.booleans() if name in BOOL_FIELDS else st.integers(-(2**62), 2**62)) for name in FIELD_NAMES}
    )


@given(values=row_values())
def test_encode_decode_round_trip(values):
    original = Row(**values)
    vector = original.encode()
    assert len(vector) == ROW_WIDTH and all(type(v) is int for v in vector)
    assert Row.decode(vector) == original


def test_gate_fields_and_g1_proposal_are_in_the_row():  # rules R3, G1
    for name in (
        "num_tokens",
        "batch_size",
        "num_extends",
        "want_prefill",
        "has_decode_work",
        "config_epoch",
        "proposal_epoch",
        "proposal_attempt_interval",
        "proposal_any_interval",
    ):
        assert name in FIELD_NAMES
    assert Row().proposal_attempt_interval == UNSET


def test_wrong_length_is_refused():
    with pytest.raises(ValueError, match="expected"):
        Row.decode([0] * (ROW_WIDTH - 1))
    with pytest.raises(ValueError, match="gathered"):
        decode_rows([0] * (ROW_WIDTH * 2 + 1), 2)


def test_decode_rows_splits_in_rank_order():
    rows = [Row(rank=i, num_tokens=10 * i, want_prefill=bool(i % 2)) for i in range(3)]
    flat = [v for r in rows for v in r.encode()]
    assert decode_rows(flat, 3) == tuple(rows)


def test_occupancy_derives_from_pages():
    assert Row(pool_pages_used=9, pool_pages_usable=10).occupancy == pytest.approx(0.9)
    assert Row().occupancy == 0.0
