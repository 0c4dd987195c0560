"""Ranks as real processes over gloo: identical votes on every rank, config agreement (R2, R6, G1)."""

from __future__ import annotations

import time
from pathlib import Path

from engine.config import PrefillDelay
from engine.drivers.procs import ProcessDriver, RankExited, RankRound
from engine.request import Finished, Submit
from tests.helpers import req, sim_args


def test_three_ranks_log_identical_votes_across_a_config_change(tmp_path: Path):  # rules R2, R6, G1, G2
    args = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    driver = ProcessDriver(args, vote_log_dir=str(tmp_path), idle_wait_s=0.0)
    records, messages = [], []
    proposed = stop_sent = False
    deadline = time.monotonic() + 120
    try:
        driver.start()
        for i in range(24):
            driver.send(i % 3, Submit(req(f"r{i}", prompt_len=30 + 7 * i, output_len=15 + i % 5)))
        while driver.alive() and time.monotonic() < deadline:
            messages += driver.poll_events(0.05)
            records += driver.poll_records()
            driver.raise_if_failed()
            if not proposed and len(records) >= 120:
                driver.propose(1, PrefillDelay(3, 12))  # handed to rank 0 mid-run, at whatever round it is
                proposed = True
            adopted = [rec.round for rec in records if rec.adopted_epoch == 1]
            if adopted and not stop_sent and records[-1].round >= adopted[0] + 100:
                driver.request_stop()  # every rank stops after the same round
                stop_sent = True
        driver.join(10)
        messages += driver.poll_events()
        records += driver.poll_records()
    finally:
        driver.terminate()

    logs = [(tmp_path / f"rank{r}.log").read_text().splitlines() for r in range(3)]
    assert stop_sent and len(logs[0]) >= 220
    assert logs[0] == logs[1] == logs[2]  # every rank: same point, open, counter, epoch each round
    epochs = [int(line.split()[5]) for line in logs[0]]
    adopted_at = epochs.index(1)
    assert adopted_at >= 120 and set(epochs[adopted_at:]) == {1} and set(epochs[:adopted_at]) == {0}
    exits = sorted((m.rank, m.rounds, m.gathers) for m in messages if isinstance(m, RankExited))
    assert exits == [(r, len(logs[0]), len(logs[0])) for r in range(3)]  # R2: one gather per round, each rank
    # G2: every record carries the epoch and intervals it was decided under; rows switch together.
    by_round = {rec.round: rec for rec in records}
    change = next(rec for rec in records if rec.adopted_epoch == 1)
    assert change.round == adopted_at  # each log line ends with the epoch in force after that round's gather
    assert by_round[change.round].config_epoch == 0 and by_round[change.round].attempt_interval == 2
    after = by_round[change.round + 1]
    assert (after.config_epoch, after.attempt_interval, after.any_interval) == (1, 3, 12)
    assert {row.config_epoch for row in after.rows} == {1}
    assert after.counter == change.counter_after  # G1: the counter is kept
    finished = {e.rid for m in messages if isinstance(m, RankRound) for e in m.events if isinstance(e, Finished)}
    assert finished == {f"r{i}" for i in range(24)}
