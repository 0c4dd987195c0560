"""The contract: every field of RankRow and RoundRecord is emitted by a real run (no field the console could
show is left at its default by accident)."""

from __future__ import annotations

import asyncio

from control.host.backends import SimBackend
from control.telemetry.trace_export import close_shared, parse_otlp_endpoint
from engine.drivers.procs import free_port
from prefill_gate.v1 import admin_pb2, requests_pb2, telemetry_pb2
from prefill_gate.v1 import types_pb2 as pb
from tests.grpc_plane import serving
from tests.helpers import sim_args


def filled(message, field) -> bool:
    value = getattr(message, field.name)
    if field.is_repeated:
        return len(value) > 0
    if field.message_type is not None:
        return message.HasField(field.name)
    return value != field.default_value


def unfilled(records: list[pb.RoundRecord]) -> set[str]:
    """Fields never seen with a non-default value; enums must show every value."""
    missing = {f"RoundRecord.{f.name}" for f in pb.RoundRecord.DESCRIPTOR.fields}
    missing |= {f"RankRow.{f.name}" for f in pb.RankRow.DESCRIPTOR.fields}
    configs = ("config", "adopted_config")  # who made a config and why travels in both (changed_by, reason)
    missing |= {f"RoundRecord.{c}.{f.name}" for c in configs for f in pb.GateConfig.DESCRIPTOR.fields}
    for record in records:
        missing -= {f"RoundRecord.{f.name}" for f in pb.RoundRecord.DESCRIPTOR.fields if filled(record, f)}
        for c in configs:
            config = getattr(record, c)
            missing -= {f"RoundRecord.{c}.{f.name}" for f in pb.GateConfig.DESCRIPTOR.fields if filled(config, f)}
        for row in record.ranks:
            missing -= {f"RankRow.{f.name}" for f in pb.RankRow.DESCRIPTOR.fields if filled(row, f)}
    points = {record.point for record in records}
    missing |= {f"RoundRecord.point={pb.GatePoint.Name(p)}" for p in pb.GatePoint.values() if p not in points}
    return missing


async def _follow(served, request: requests_pb2.SubmitRequest) -> None:
    async for _ in served.requests.Submit(request, metadata=served.auth):
        pass


async def test_a_real_run_fills_every_field_of_the_round_record():  # contract test (dynamo#7123), G1, G2
    # A small pool (retraction, the watermark: two or three of a rank's requests fill it), long prompts
    # (resident chunks), prefix hits (storage reads), and rank tracing to a collector that is not there
    # (spans_dropped).
    args = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6, kv_pages=72, max_num_seqs=48)
    endpoint = f"127.0.0.1:{free_port()}"
    backend = SimBackend(
        args,
        observer="control.telemetry.tracing:rank_observer",
        observer_kwargs={
            "endpoint": endpoint,
            "run_id": "contract",
            "sample_rate": 1.0,
            "queue_spans": 8,
            "export_timeout_s": 0.2,
        },
    )
    try:
        async with serving(args, backend=backend) as served:
            # Batched (RoundRecord.following): the records inside a message carry every field too.
            lossless = served.telemetry.WatchRounds(
                telemetry_pb2.WatchRoundsRequest(from_round=0, max_queue=65536, max_batch=64)
            )
            latest = served.telemetry.WatchRounds(
                telemetry_pb2.WatchRoundsRequest(mode=telemetry_pb2.WATCH_MODE_LATEST_ONLY)
            )
            records = [await latest.read()]
            submits = [
                asyncio.create_task(
                    _follow(
                        served,
                        requests_pb2.SubmitRequest(
                            prompt_len=300 if i % 5 == 0 else 60 + 10 * i,
                            output_len=200 + (13 * i) % 100,
                            prefix_hit=32 if i % 4 == 1 else 0,
                            rank=i % 3 if i % 7 else 0,
                        ),
                    )
                )
                for i in range(30)
            ]
            await served.wait_round(100)
            await served.admin.UpdateIntervals(
                admin_pb2.UpdateIntervalsRequest(attempt_interval=3, any_interval=9), metadata=served.auth
            )
            await asyncio.wait_for(asyncio.gather(*submits), 60)
            # The engine ran on meanwhile: past what the transport already held, a record says what it skipped.
            for _ in range(2000):
                records.append(await latest.read())
                if records[-1].dropped_before:
                    break
            latest.cancel()
            await served.plane.drain()
            async for message in lossless:
                records += [message, *message.following]
    finally:
        close_shared(parse_otlp_endpoint(endpoint), 0.5)
    assert unfilled(records) == set()
