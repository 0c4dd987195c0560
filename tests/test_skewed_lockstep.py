"""Four ranks in lockstep, gate on, skewed traffic: a pressured rank blocks ALL (P4), ANY releases its peers."""

from __future__ import annotations

from engine.drivers.lockstep import LockstepDriver
from engine.gate import GatePoint
from tests.helpers import req, sim_args


def test_pressured_rank_blocks_all_and_any_releases_the_peers():  # rules P4, P5, R4
    args = sim_args(
        dp_size=4,
        prefill_attempt_interval=2,
        prefill_any_attempt_interval=8,
        kv_pages=64,
        page_size=16,
        max_num_seqs=64,
        chunked_prefill_size=512,
    )
    driver = LockstepDriver(args)
    # Rank 0 takes the heavy traffic: long prompts with long outputs fill its pool past the watermark.
    for i in range(2):
        driver.submit(0, req(f"heavy{i}", prompt_len=440, output_len=300))
    records = []
    for r in range(400):
        if r % 4 == 0:
            for peer in (1, 2, 3):
                driver.submit(peer, req(f"light{r}-{peer}", prompt_len=48, output_len=40))
        if r % 20 == 10:
            driver.submit(0, req(f"more{r}", prompt_len=64, output_len=20))
        records.append(driver.step()[0].record)

    def pressured(row):
        return row.occupancy > 0.9 and row.waiting_prompts > 0 and not row.resident_chunks

    def only_rank0_blocks(rec) -> bool:
        prev = records[rec.round - 1].rows  # the vote read the previous round's rows
        peers_ready = all(row.want_prefill or not row.has_decode_work for row in prev[1:])
        return peers_ready and any(row.want_prefill for row in prev[1:]) and pressured(prev[0])

    blocked = [rec for rec in records[1:] if rec.point is GatePoint.ALL and only_rank0_blocks(rec)]
    assert blocked, "no ALL point where the pressured rank was the only blocker"
    for rec in blocked:
        prev = records[rec.round - 1].rows
        assert (prev[0].want_prefill, prev[0].has_decode_work) == (False, True)  # P4
        assert not rec.open  # its peers all wanted prefill, and still the ALL point stayed shut
    released = [
        rec for rec in records if rec.point is GatePoint.ANY and rec.open and pressured(records[rec.round - 1].rows[0])
    ]
    assert released, "no ANY point released the peers while rank 0 was pressured"
    for rec in released:
        assert rec.rows[0].num_extends == 0  # the pressured rank's new prompts still wait (P4)
        assert any(row.num_extends > 0 for row in rec.rows[1:])  # its peers' backlog ran in the window
        assert rec.counter_after == 0
