"""Ranks as real processes over gloo: identical votes on every rank, config agreement (R2, R6, G1)."""

from __future__ import annotations

from pathlib import Path

from engine.config import PrefillDelay
from engine.procs import ProcessDriver, RankExited, RankRound
from engine.request import Finished, Submit
from tests.helpers import req, sim_args


def test_three_ranks_log_identical_votes_across_a_config_change(tmp_path: Path):  # rules R2, R6, G1, G2
    args = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    driver = ProcessDriver(args, max_rounds=400, vote_log_dir=str(tmp_path), idle_wait_s=0.0)
    records, messages = [], []
    try:
        driver.start()
        for i in range(24):
            driver.send(i % 3, Submit(req(f"r{i}", prompt_len=30 + 7 * i, output_len=15 + i % 5)))
        proposed = False
        while driver.alive():
            messages += driver.poll_events(0.05)
            records += driver.poll_records()
            driver.raise_if_failed()
            if not proposed and len(records) >= 120:
                driver.propose(1, PrefillDelay(3, 12))  # handed to rank 0 mid-run
                proposed = True
        messages += driver.poll_events()
        records += driver.poll_records()
    finally:
        driver.terminate()

    logs = [(tmp_path / f"rank{r}.log").read_text().splitlines() for r in range(3)]
    assert len(logs[0]) == 400
    assert logs[0] == logs[1] == logs[2]  # every rank: same point, open, counter, epoch each round
    epochs = [int(line.split()[5]) for line in logs[0]]
    adopted_at = epochs.index(1)
    assert 120 <= adopted_at < 400 and set(epochs[adopted_at:]) == {1}
    exits = [m for m in messages if isinstance(m, RankExited)]
    assert sorted((m.rank, m.rounds, m.gathers) for m in exits) == [(r, 400, 400) for r in range(3)]  # R2
    # G2: every record carries the epoch and intervals it was decided under; rows switch together.
    by_round = {rec.round: rec for rec in records}
    change = next(rec for rec in records if rec.adopted_epoch == 1)
    assert by_round[change.round].config_epoch == 0 and by_round[change.round].attempt_interval == 2
    after = by_round[change.round + 1]
    assert (after.config_epoch, after.attempt_interval, after.any_interval) == (1, 3, 12)
    assert {row.config_epoch for row in after.rows} == {1}
    assert after.counter == change.counter_after  # G1: the counter is kept
    finished = {e.rid for m in messages if isinstance(m, RankRound) for e in m.events if isinstance(e, Finished)}
    assert finished == {f"r{i}" for i in range(24)}
