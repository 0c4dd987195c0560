"""Engine values to their protobuf form (the contract in protos/). One place, so the console can
never show a field the engine does not emit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.record import RoundRecord
from engine.rows import UNSET, Row
from engine.scheduler.plan import K_PREFILL_WATERMARK
from prefill_gate.v1 import types_pb2 as pb


def rank_row(row: Row) -> pb.RankRow:
    """One gathered row."""
    occupancy = row.occupancy
    return pb.RankRow(
        rank=row.rank,
        num_tokens=row.num_tokens,
        batch_size=row.batch_size,
        num_extends=row.num_extends,
        want_prefill=row.want_prefill,
        has_decode_work=row.has_decode_work,
        planned_prefill=row.planned_prefill,
        occupancy=occupancy,
        pool_pages_used=row.pool_pages_used,
        pool_pages_usable=row.pool_pages_usable,
        resident_chunks=row.resident_chunks,
        waiting_prompts=row.waiting_prompts,
        storage_reads=row.storage_reads,
        retracted=row.retracted,
        running=row.running,
        config_epoch=row.config_epoch,
        prefill_tokens=row.prefill_tokens,
        pending_prefill_tokens=row.pending_prefill_tokens,
        retractions_total=row.retractions_total,
        forward_us=row.forward_us,
        above_watermark=occupancy > K_PREFILL_WATERMARK,
        blocks_all=row.has_decode_work and not row.want_prefill,
        spans_dropped=row.spans_dropped,
    )


@dataclass(frozen=True, slots=True)
class Origin:
    """Who made a config and why (GateConfig.changed_by / reason): "launch", "operator", "tuner", ..."""

    changed_by: str
    reason: str


# A config epoch's origin, as whoever accepted the change knows it (None: unknown).
OriginOf = Callable[[int], Origin | None]


def gate_config(
    epoch: int, attempt: int | None, any_: int | None, policy: str, origin: Origin | None = None
) -> pb.GateConfig:
    """The config in force; intervals are 0 when the gate is off."""
    return pb.GateConfig(
        epoch=epoch,
        attempt_interval=attempt or 0,
        any_interval=any_ or 0,
        enabled=attempt is not None,
        policy=policy,
        changed_by=origin.changed_by if origin else "",
        reason=origin.reason if origin else "",
    )


def _adopted_config(record: RoundRecord, origin_of: OriginOf | None) -> pb.GateConfig | None:
    """The config rank 0 proposed in this round's row and every rank adopted after the gather (G1)."""
    epoch = record.adopted_epoch
    proposal = record.rows[0]
    if not epoch or proposal.proposal_epoch != epoch:
        return None
    attempt = None if proposal.proposal_attempt_interval == UNSET else proposal.proposal_attempt_interval
    any_ = None if proposal.proposal_any_interval == UNSET else proposal.proposal_any_interval
    return gate_config(epoch, attempt, any_, record.policy, origin_of(epoch) if origin_of else None)


def round_record(record: RoundRecord, run_id: str, origin_of: OriginOf | None = None) -> pb.RoundRecord:
    """A round record with every rank's row; `origin_of` names who made each config and why."""
    rows = [rank_row(row) for row in record.rows]
    origin = origin_of(record.config_epoch) if origin_of else None
    return pb.RoundRecord(
        round=record.round,
        unix_nanos=record.unix_nanos,
        counter=record.counter,
        point=int(record.point),
        open=record.open,
        counter_after=record.counter_after,
        all_decode_or_idle=record.all_decode_or_idle,
        round_seconds=record.round_seconds,
        ranks=rows,
        config=gate_config(record.config_epoch, record.attempt_interval, record.any_interval, record.policy, origin),
        clock_seconds=record.clock,
        run_id=run_id,
        adopted_epoch=record.adopted_epoch or 0,
        ranks_extending=sum(1 for row in rows if row.num_extends),
        ranks_wanting=sum(1 for row in rows if row.want_prefill),
        ranks_blocking_all=sum(1 for row in rows if row.blocks_all),
        ttft_seconds=record.ttft,
        itl_seconds=[seconds for seconds, _ in record.itl],
        itl_tokens=[tokens for _, tokens in record.itl],
        adopted_config=_adopted_config(record, origin_of),
    )
