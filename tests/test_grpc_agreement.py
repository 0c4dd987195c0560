"""Hot reload over gRPC on a real 3-process engine: every rank switches on the same round (G1, G2, R4)."""

from __future__ import annotations

import asyncio

from control.host.backends import ProcessBackend
from prefill_gate.v1 import admin_pb2, requests_pb2, telemetry_pb2
from prefill_gate.v1 import types_pb2 as pb
from tests.grpc_plane import serving
from tests.helpers import sim_args


def expected_vote(record: pb.RoundRecord, previous: pb.RoundRecord | None) -> tuple[int, bool]:
    """R4/R5 recomputed from the record's counter, its config's intervals and the previous round's rows."""
    counter, attempt, any_ = record.counter, record.config.attempt_interval, record.config.any_interval
    if counter != 0 and counter % any_ == 0:
        point = pb.GATE_POINT_ANY
        opened = previous is not None and any(row.want_prefill for row in previous.ranks)
    elif counter % attempt == 0:
        point = pb.GATE_POINT_ALL
        opened = previous is not None and all(row.want_prefill or not row.has_decode_work for row in previous.ranks)
    else:
        point, opened = pb.GATE_POINT_NONE, False
    return point, opened


async def _follow(stub, request: requests_pb2.SubmitRequest, auth) -> str:
    async for event in stub.Submit(request, metadata=auth):
        if event.HasField("finished"):
            return event.finished.reason
    raise AssertionError(f"{request.request_id}: stream ended without a finish")


async def test_interval_change_is_adopted_by_every_rank_on_one_round():  # rules G1, G2, R3, R4, R5
    args = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
    async with serving(args, backend=ProcessBackend(args)) as served:
        records: list[pb.RoundRecord] = []

        async def watch() -> None:
            request = telemetry_pb2.WatchRoundsRequest(from_round=0, max_queue=65536)
            async for record in served.telemetry.WatchRounds(request):
                records.append(record)

        watcher = asyncio.create_task(watch())
        submits = [
            asyncio.create_task(
                _follow(
                    served.requests,
                    requests_pb2.SubmitRequest(
                        request_id=f"r{i}", prompt_len=40 + 23 * i, output_len=40 + 11 * (i % 5), rank=i % 3
                    ),
                    served.auth,
                )
            )
            for i in range(15)
        ]
        await served.wait_round(60)
        response = await served.admin.UpdateIntervals(
            admin_pb2.UpdateIntervalsRequest(attempt_interval=3, any_interval=12, expected_epoch=0),
            metadata=served.auth,
        )
        # More prompts after the change, so that the new intervals also gate real work.
        submits += [
            asyncio.create_task(
                _follow(
                    served.requests,
                    requests_pb2.SubmitRequest(request_id=f"s{i}", prompt_len=90 + 17 * i, output_len=50, rank=i % 3),
                    served.auth,
                )
            )
            for i in range(9)
        ]
        assert await asyncio.wait_for(asyncio.gather(*submits), 60) == ["length"] * len(submits)
        await served.wait_round(response.adopted_round + 40)
        await served.plane.drain()  # the stream ends with OK once every rank stopped
        await asyncio.wait_for(watcher, 10)
        assert served.controller.records_dropped() == 0

    adopted = response.adopted_round
    assert (response.config.epoch, response.config.attempt_interval, response.config.any_interval) == (1, 3, 12)
    assert [r.round for r in records] == list(range(len(records)))  # lossless and in order
    assert all(r.dropped_before == 0 for r in records)
    change = records[adopted]
    assert change.adopted_epoch == 1 and [r.round for r in records if r.adopted_epoch] == [adopted]
    for record in records:
        epoch = 0 if record.round <= adopted else 1
        # G1: every rank decided each round under the same epoch, and they all switch after `adopted`.
        assert {row.config_epoch for row in record.ranks} == {epoch}, record.round
        # G2: the record carries the config it was decided under.
        assert (record.config.epoch, record.config.attempt_interval, record.config.any_interval) == (
            (0, 2, 6) if epoch == 0 else (1, 3, 12)
        ), record.round
    previous = None
    for record in records:
        assert (record.point, record.open) == expected_vote(record, previous), record.round  # R4, R5
        if previous is not None:
            assert record.counter == previous.counter_after, record.round  # R3; G1 keeps the counter
        previous = record
    before, after = records[: adopted + 1], records[adopted + 1 :]
    # Not vacuous: each side has ALL points only the interval in force explains, and open windows.
    assert any(r.point == pb.GATE_POINT_ALL and r.counter % 3 for r in before)
    assert any(r.point == pb.GATE_POINT_ALL and r.counter % 2 for r in after)
    assert any(r.open for r in before) and any(r.open for r in after)
