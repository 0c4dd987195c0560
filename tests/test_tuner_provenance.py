"""Every change is explained: changed_by and reason in GetConfig, the stream's config and its adoption
record, a `gate.config_adopted` span event on the round's root span, prefill_gate_config_changes_total{by};
and a name or reason that cannot be shown is refused like any bad field."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.host.backends import SimBackend
from control.host.controller import ConfigRejected, Controller
from control.telemetry.telemetry_cli import ENDPOINT_ENV, attach_telemetry
from prefill_gate.v1 import admin_pb2, telemetry_pb2
from tests.grpc_plane import bad_fields, serving
from tests.helpers import sim_args
from tests.test_otel_metrics import scrape, total
from tests.test_tracing import OtlpReceiver, telemetry_ns

ARGS = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6)


async def test_who_and_why_travel_with_the_config_in_every_view():
    async with serving(ARGS, pace=2.0) as served:
        launch = await served.admin.GetConfig(admin_pb2.GetConfigRequest())
        assert (launch.changed_by, launch.reason) == ("launch", "launch: startup flags, A=2 K=6")
        watch = served.telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest())
        first = await watch.read()
        assert first.config.changed_by == "launch" and not first.HasField("adopted_config")
        by_hand = await served.admin.UpdateIntervals(
            admin_pb2.UpdateIntervalsRequest(attempt_interval=3, any_interval=9), metadata=served.auth
        )
        assert (by_hand.config.changed_by, by_hand.config.reason) == ("operator", "operator: A 2->3, K 6->9")
        tuned = await served.admin.UpdateIntervals(
            admin_pb2.UpdateIntervalsRequest(
                attempt_interval=3, any_interval=12, changed_by="tuner", reason="tuner: TTFT p99 low -> K 9->12"
            ),
            metadata=served.auth,
        )
        records = []
        while len([r for r in records if r.adopted_epoch]) < 2:
            records.append(await watch.read())
        watch.cancel()
        snapshot = await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
    adoptions = [r for r in records if r.adopted_epoch]
    assert [(r.adopted_config.epoch, r.adopted_config.changed_by, r.adopted_config.reason) for r in adoptions] == [
        (1, "operator", "operator: A 2->3, K 6->9"),
        (2, "tuner", "tuner: TTFT p99 low -> K 9->12"),
    ]
    assert [r.round for r in adoptions] == [by_hand.adopted_round, tuned.adopted_round]
    after = [r for r in records if r.round > tuned.adopted_round]
    assert all(r.config.changed_by == "tuner" and r.config.reason.endswith("K 9->12") for r in after)
    assert (snapshot.config.epoch, snapshot.config.changed_by) == (2, "tuner")


async def test_a_name_or_reason_that_cannot_be_shown_is_refused_and_changes_nothing():
    async with serving(ARGS, pace=2.0) as served:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.admin.UpdateIntervals(
                admin_pb2.UpdateIntervalsRequest(
                    attempt_interval=3, any_interval=9, changed_by="x" * 65, reason="two\nlines"
                ),
                metadata=served.auth,
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert bad_fields(refused.value) == {"changed_by", "reason"}
        config = await served.admin.GetConfig(admin_pb2.GetConfigRequest())
        assert (config.epoch, config.changed_by) == (0, "launch")


FUZZED = Controller(ARGS, SimBackend(ARGS, None))  # never started: validate_only touches no rank


@settings(max_examples=60, deadline=None)
@given(changed_by=st.text(max_size=80), reason=st.text(max_size=600))
def test_only_short_printable_names_and_reasons_are_accepted(changed_by, reason):  # fuzz what users reach
    controller = FUZZED
    try:
        asyncio.run(controller.update_intervals(3, 9, changed_by=changed_by, reason=reason, validate_only=True))
    except ConfigRejected as exc:
        fields = {name for name, _ in exc.violations}
        assert fields and fields <= {"changed_by", "reason"}
        assert ("changed_by" in fields) == (len(changed_by) > 64 or not changed_by.isprintable())
        assert ("reason" in fields) == (len(reason) > 512 or not reason.isprintable())
        return
    assert len(changed_by) <= 64 and len(reason) <= 512 and changed_by.isprintable() and reason.isprintable()


def test_each_adoption_is_a_span_event_and_a_count_by_who_made_it(monkeypatch):
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    receiver = OtlpReceiver().start()
    controller = Controller(ARGS, SimBackend(ARGS, None, pace=2.0), stop_when_idle=False)
    ns = telemetry_ns(
        "--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--otlp-endpoint", receiver.endpoint,
        "--trace-sample-rate", "0",
    )  # fmt: skip

    async def run() -> tuple[list, dict]:
        controller.start()
        stop = await attach_telemetry(controller, ns)
        runner = asyncio.create_task(controller.run())
        loop = asyncio.get_running_loop()
        try:
            first = await controller.update_intervals(3, 9)
            second = await controller.update_intervals(3, 12, changed_by="tuner", reason="tuner: why -> K 9->12")
            controller.request_stop()
            await runner
            port = controller.backend.sinks[-1].port
            samples = await loop.run_in_executor(None, scrape, port)
        finally:
            await stop()
        return [first.adopted_round, second.adopted_round], samples

    try:
        rounds, samples = asyncio.run(run())
    finally:
        receiver.server.stop(0)
    assert total(samples, "prefill_gate_config_changes_total", by="operator") == 1
    assert total(samples, "prefill_gate_config_changes_total", by="tuner") == 1
    events = {}
    for _, span in receiver.spans():
        for event in span.events:
            if span.name == "round" and event.name == "gate.config_adopted":
                attributes = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in event.attributes}
                events[attributes["gate.config_epoch"]] = (attributes["gate.changed_by"], attributes["gate.reason"])
    # Adoption rounds are always traced, even at sample rate 0.
    assert events == {1: ("operator", "operator: A 2->3, K 6->9"), 2: ("tuner", "tuner: why -> K 9->12")}
    assert len(rounds) == 2
