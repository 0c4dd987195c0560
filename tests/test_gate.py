"""The gate's counter and vote (rules R3-R6, G1), with hand-computed traces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import ServerArgs
from engine.gate import GatePoint, PrefillGate, attempt_point, decide, next_rounds
from engine.rows import Row

N, ANY, ALL = GatePoint.NONE, GatePoint.ANY, GatePoint.ALL


def row(want=False, dec=False, bs=None, ext=0) -> Row:
    """A gathered row: `bs` defaults to 1 when the rank decodes or extends, else 0 (idle)."""
    batch = bs if bs is not None else (1 if (dec or ext) else 0)
    return Row(want_prefill=want, has_decode_work=dec, batch_size=batch, num_extends=ext, num_tokens=batch)


def run_trace(attempt: int, any_: int, rounds: list[list[Row]]) -> list[tuple[GatePoint, bool, int]]:
    """Vote, then observe that round's rows, as a rank does each round."""
    gate = PrefillGate(attempt, any_)
    out = []
    for rows in rounds:
        vote = gate.vote()
        out.append((vote.point, vote.open, vote.counter))
        gate.observe(rows)
    return out


DEC = row(dec=True)  # decoding, no prefill wanted
DEC_WANT = row(want=True, dec=True)  # decoding with prefill waiting
IDLE_WANT = row(want=True)  # no decode work, a prompt waiting
EXT = row(want=True, dec=True, ext=1)  # extended this round, more backlog

TRACES = {
    # Round 0 is an ALL point and closed (no rows yet, R5); ALL every 3, ANY every 6 (not at 0).
    "round0_all_then_cadence": (
        3,
        6,
        [[DEC]] * 8,
        [
            (ALL, False, 0),
            (N, False, 1),
            (N, False, 2),
            (ALL, False, 3),
            (N, False, 4),
            (N, False, 5),
            (ANY, False, 6),
            (N, False, 7),
        ],
    ),
    # A=2, K=4: rank 1 blocks ALL (want=false, decodes=true); at rounds=4 both points fall: ANY wins and
    # opens on rank 0's want; rank 0 extends that round, so the counter resets to 0: an ALL point again.
    "any_wins_a_tie": (
        2,
        4,
        [[DEC_WANT, DEC]] * 4 + [[EXT, DEC], [DEC, DEC], [DEC, DEC]],
        [
            (ALL, False, 0),
            (N, False, 1),
            (ALL, False, 2),
            (N, False, 3),
            (ANY, True, 4),
            (ALL, False, 0),
            (N, False, 1),
        ],
    ),
    # An all-idle round resets the counter, so a prompt arriving at an idle engine meets an ALL point; a
    # burst then drains in consecutive prefill rounds because every extending round resets to 0, until
    # a rank that decodes without backlog closes the ALL point again.
    "idle_resets_and_burst_drains": (
        4,
        8,
        [[row(), row()], [IDLE_WANT, IDLE_WANT], [EXT, EXT], [EXT, EXT], [EXT, DEC], [DEC, DEC], [DEC, DEC]],
        [
            (ALL, False, 0),
            (ALL, True, 0),
            (ALL, True, 0),
            (ALL, True, 0),
            (ALL, True, 0),
            (ALL, False, 0),
            (N, False, 1),
        ],
    ),
    # P5: a rank without decode work never blocks ALL (want or not decodes): rank 1 idle, rank 0 wants.
    "no_decode_rank_never_blocks_all": (
        2,
        4,
        [[DEC_WANT, row()], [DEC_WANT, row()], [DEC_WANT, row()]],
        [(ALL, False, 0), (N, False, 1), (ALL, True, 2)],
    ),
    # A rank that decodes and never wants (as a pressured rank publishes, P4) keeps ALL shut; only the ANY
    # point releases its peer's backlog.
    "decoding_rank_without_want_blocks_all_until_any": (
        1,
        3,
        [[DEC_WANT, DEC]] * 4,
        [(ALL, False, 0), (ALL, False, 1), (ALL, False, 2), (ANY, True, 3)],
    ),
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_hand_computed_traces(name):  # rules R3, R4, R5, P5
    attempt, any_, rounds, expected = TRACES[name]
    assert run_trace(attempt, any_, rounds) == expected


def test_attempt_points():  # rule R4
    assert attempt_point(0, 2, 4) is ALL  # never ANY at 0
    assert attempt_point(4, 2, 4) is ANY  # tie: ANY wins
    assert attempt_point(2, 2, 4) is ALL
    assert attempt_point(3, 2, 4) is N
    assert attempt_point(5, 5, 5) is ANY


def test_first_vote_is_closed():  # rule R5
    vote = PrefillGate(1, 1).vote()
    assert (vote.point, vote.open) == (ALL, False)


def test_counter_update():  # rule R3
    assert next_rounds(7, [DEC, DEC]) == 8
    assert next_rounds(7, [DEC, EXT]) == 0  # any extend resets
    assert next_rounds(7, [row(), row()]) == 0  # all idle resets
    assert next_rounds(7, [row(), DEC]) == 8


def test_reconfigure_keeps_the_counter():  # rule G1
    gate = PrefillGate(2, 4)
    for _ in range(3):
        gate.observe([DEC])
    gate.reconfigure(3, 6)
    vote = gate.vote()
    assert (gate.rounds, vote.point, vote.counter) == (3, ALL, 3)
    gate.reconfigure(None, None)
    assert not gate.enabled and gate.vote().open and gate.rounds == 3  # off: every round open (R8)


rows_strategy = st.lists(
    st.builds(row, want=st.booleans(), dec=st.booleans(), ext=st.integers(0, 1)), min_size=1, max_size=8
)


@given(rounds=st.integers(0, 500), a=st.integers(1, 20), k_extra=st.integers(0, 40), rows=rows_strategy)
def test_vote_is_a_pure_function_of_its_inputs(rounds, a, k_extra, rows):  # rule R6
    k = a + k_extra
    first = decide(rounds, a, k, rows)
    again = decide(rounds, a, k, [Row.decode(r.encode()) for r in rows])  # as another rank decodes them
    assert first == again
    if first.point is ANY:
        assert first.open == any(r.want_prefill for r in rows)
    elif first.point is ALL:
        assert first.open == all(r.want_prefill or not r.has_decode_work for r in rows)
    else:
        assert not first.open


@pytest.mark.parametrize(("attempt", "any_"), [(3, None), (None, 3), (0, 0), (-2, 4), (4, 2), (1, 2**32), (True, 2)])
def test_the_gate_refuses_what_startup_refuses_in_its_words(attempt, any_):  # rule C2
    with pytest.raises(ValueError) as startup:
        ServerArgs(executor="sim", prefill_attempt_interval=attempt, prefill_any_attempt_interval=any_)
    with pytest.raises(ValueError) as built:
        PrefillGate(attempt, any_)
    assert str(built.value) == str(startup.value)
    gate = PrefillGate(2, 4)
    gate.rounds = 5
    with pytest.raises(ValueError):
        gate.reconfigure(attempt, any_)
    assert (gate.attempt_interval, gate.any_interval, gate.rounds) == (2, 4, 5)  # nothing changed
