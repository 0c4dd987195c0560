"""Admin and request RPCs over a real server: validation, epochs, auth and draining; bad input fuzzed."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import MAX_INTERVAL
from engine.scheduler.pool import pages_for
from prefill_gate.v1 import admin_pb2, requests_pb2, telemetry_pb2
from tests.grpc_plane import TOKEN, bad_fields, bad_request, serving
from tests.helpers import sim_args

ARGS = sim_args(dp_size=2, prefill_attempt_interval=2, prefill_any_attempt_interval=6)
OK = grpc.StatusCode.OK
INT64 = 2**63 - 1


@pytest.fixture
async def served():
    """One server for every example of a test."""
    async with serving(ARGS, pace=0.5) as running:
        await running.wait_round(5)
        yield running


def metadata_for(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def auth_code(token: str | None) -> grpc.StatusCode | None:
    """The code auth answers with, None when the token is right."""
    if token is None:
        return grpc.StatusCode.UNAUTHENTICATED
    return None if token == TOKEN else grpc.StatusCode.PERMISSION_DENIED


async def outcome(call) -> tuple[grpc.StatusCode, object]:
    """(code, response or error) of an awaited unary call."""
    try:
        return OK, await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error


# -- the admin call ---------------------------------------------------------------------------------

intervals = st.one_of(
    st.none(),
    st.sampled_from([0, -1, 1, 2, 3, 8, MAX_INTERVAL, MAX_INTERVAL + 1, INT64, -INT64]),
    st.integers(-(2**40), 2**40),
)


def interval_violations(attempt: int | None, any_: int | None, disable: bool) -> set[str]:
    """The fields an INVALID_ARGUMENT must name (C2, C3, and the contract's uint32 range)."""
    given_fields = {name for name, v in (("attempt_interval", attempt), ("any_interval", any_)) if v is not None}
    if disable:
        return given_fields
    if not given_fields:
        return {"attempt_interval", "any_interval"}
    # As ServerArgs.prefill_delay reports the first problem: the missing interval, a range, then K < A.
    if len(given_fields) == 1:
        return {"attempt_interval", "any_interval"} - given_fields
    for name, value in (("attempt_interval", attempt), ("any_interval", any_)):
        if not 1 <= value <= MAX_INTERVAL:
            return {name}
    if any_ < attempt:
        return {"attempt_interval", "any_interval"}
    return set()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    attempt=intervals,
    any_=intervals,
    disable=st.booleans(),
    epoch=st.one_of(st.none(), st.sampled_from([0, 1, 7, 2**64 - 1])),
    validate_only=st.booleans(),
    token=st.sampled_from([TOKEN, None, "wrong-token", TOKEN + "x"]),
)
async def test_fuzzed_interval_updates_get_the_right_code_and_change_nothing(
    served, attempt, any_, disable, epoch, validate_only, token
):  # rules C2, C3; auth; expected_epoch
    before = await served.admin.GetConfig(admin_pb2.GetConfigRequest())
    violations = interval_violations(attempt, any_, disable)
    stale = epoch is not None and epoch != before.epoch
    # A request that would be accepted is sent validate-only: the config must stay as it is.
    validate_only = validate_only or not (violations or stale)
    request = admin_pb2.UpdateIntervalsRequest(disable=disable, validate_only=validate_only)
    if attempt is not None:
        request.attempt_interval = attempt
    if any_ is not None:
        request.any_interval = any_
    if epoch is not None:
        request.expected_epoch = epoch
    code, result = await outcome(served.admin.UpdateIntervals(request, metadata=metadata_for(token)))

    expected = auth_code(token) or (
        grpc.StatusCode.INVALID_ARGUMENT if violations else grpc.StatusCode.FAILED_PRECONDITION if stale else OK
    )
    assert code == expected, (code, getattr(result, "details", lambda: result)())
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert bad_fields(result) == violations
    if code == OK:
        assert result.validated_only and result.config.epoch == before.epoch
        assert result.config.enabled == (not disable)
        if not disable:
            assert (result.config.attempt_interval, result.config.any_interval) == (attempt, any_)
    assert await served.admin.GetConfig(admin_pb2.GetConfigRequest()) == before
    latest = (await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())).latest
    assert latest.config == before and latest.adopted_epoch == 0  # G2: rounds still decided under it


# -- the request calls ------------------------------------------------------------------------------

lengths = st.one_of(st.sampled_from([0, -1, 1, 16, 10_000, INT64, -INT64]), st.integers(-100, 5000))


def submit_violations(prompt: list[int], prompt_len: int, output_len: int, prefix_hit: int, rank: int | None):
    """The SubmitRequest fields an INVALID_ARGUMENT must name."""
    out = set()
    if any(not 0 <= t < ARGS.model_vocab for t in prompt):
        out.add("prompt")
    effective = prompt_len if prompt_len or not prompt else len(prompt)
    if effective < 1 or (prompt and len(prompt) != effective):
        out.add("prompt_len")
    if output_len < 1:
        out.add("output_len")
    if prefix_hit < 0 or (effective >= 1 and prefix_hit >= effective):
        out.add("prefix_hit")
    if effective >= 1 and output_len >= 1 and pages_for(effective + output_len, ARGS.page_size) > ARGS.kv_pages:
        out |= {"prompt_len", "output_len"}
    if rank is not None and rank >= ARGS.dp_size:
        out.add("rank")
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.sampled_from([-5, 0, 7, ARGS.model_vocab, 2**31 - 1]), max_size=3),
    prompt_len=lengths,
    output_len=lengths,
    prefix_hit=st.one_of(st.sampled_from([0, -1, 64]), st.integers(-(2**62), 2**62)),
    rank=st.one_of(st.none(), st.sampled_from([0, 1, 2, 2**32 - 1])),
    token=st.sampled_from([TOKEN, None, "nope"]),
)
async def test_fuzzed_submissions_get_the_right_code_and_reach_no_rank(
    served, prompt, prompt_len, output_len, prefix_hit, rank, token
):  # request validation; auth
    violations = submit_violations(prompt, prompt_len, output_len, prefix_hit, rank)
    expected = auth_code(token) or (grpc.StatusCode.INVALID_ARGUMENT if violations else OK)
    if expected == OK:
        return  # a valid request would be served: the fuzz is about bad input
    before = (await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())).stats.requests_submitted
    request = requests_pb2.SubmitRequest(
        prompt=prompt, prompt_len=prompt_len, output_len=output_len, prefix_hit=prefix_hit, rank=rank
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in served.requests.Submit(request, metadata=metadata_for(token)):
            pass
    assert refused.value.code() == expected, refused.value.details()
    if expected == grpc.StatusCode.INVALID_ARGUMENT:
        assert bad_fields(refused.value) == violations
    snapshot = await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
    assert snapshot.stats.requests_submitted == before
    assert (snapshot.config.epoch, snapshot.config.attempt_interval, snapshot.config.any_interval) == (0, 2, 6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request_id=st.sampled_from(["", "never-submitted", "x" * 300]), token=st.sampled_from([TOKEN, None, "nope"]))
async def test_fuzzed_aborts(served, request_id, token):  # auth; an unknown id is a no-op
    code, result = await outcome(
        served.requests.Abort(requests_pb2.AbortRequest(request_id=request_id), metadata=metadata_for(token))
    )
    expected = auth_code(token) or (grpc.StatusCode.INVALID_ARGUMENT if not request_id else OK)
    assert code == expected
    if code == OK:
        assert not result.found


async def test_the_config_and_rounds_after_bad_input_are_as_before(served):  # G2: records keep the old config
    snapshot = await served.telemetry.GetSnapshot(telemetry_pb2.GetSnapshotRequest())
    for bad in (
        admin_pb2.UpdateIntervalsRequest(attempt_interval=0, any_interval=0),
        admin_pb2.UpdateIntervalsRequest(attempt_interval=4, any_interval=2),
        admin_pb2.UpdateIntervalsRequest(disable=True, attempt_interval=2),
        admin_pb2.UpdateIntervalsRequest(attempt_interval=2, any_interval=8, expected_epoch=3),
    ):
        code, _ = await outcome(served.admin.UpdateIntervals(bad, metadata=served.auth))
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    await served.wait_round(snapshot.latest.round + 50)
    rounds = await served.telemetry.GetRounds(telemetry_pb2.GetRoundsRequest(from_round=snapshot.latest.round))
    assert len(rounds.records) >= 50  # the engine went on
    assert all(
        (r.config.epoch, r.config.attempt_interval, r.config.any_interval, r.adopted_epoch) == (0, 2, 6, 0)
        for r in rounds.records
    )
    assert all(row.config_epoch == 0 for r in rounds.records for row in r.ranks)


async def test_accepted_change_and_stale_epoch(served):  # rules G1, C3; optimistic concurrency
    admin = served.admin
    checked = await admin.UpdateIntervals(
        admin_pb2.UpdateIntervalsRequest(attempt_interval=4, any_interval=8, validate_only=True), metadata=served.auth
    )
    assert checked.validated_only and checked.config.epoch == 0 and checked.config.attempt_interval == 4
    applied = await admin.UpdateIntervals(
        admin_pb2.UpdateIntervalsRequest(attempt_interval=4, any_interval=8, expected_epoch=0), metadata=served.auth
    )
    # Answered only once the change happened: the adopting round is already in the history.
    held = await served.telemetry.GetRounds(
        telemetry_pb2.GetRoundsRequest(from_round=applied.adopted_round, to_round=applied.adopted_round + 1)
    )
    assert [r.adopted_epoch for r in held.records][:1] == [1]
    assert (applied.config.epoch, applied.config.attempt_interval, applied.config.any_interval) == (1, 4, 8)
    assert await admin.GetConfig(admin_pb2.GetConfigRequest()) == applied.config
    code, error = await outcome(
        admin.UpdateIntervals(
            admin_pb2.UpdateIntervalsRequest(attempt_interval=2, any_interval=6, expected_epoch=0),
            metadata=served.auth,
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "latest accepted epoch is 1" in error.details()
    off = await admin.UpdateIntervals(
        admin_pb2.UpdateIntervalsRequest(disable=True, expected_epoch=1), metadata=served.auth
    )
    assert (off.config.epoch, off.config.enabled, off.config.attempt_interval) == (2, False, 0)
    # What is already in force changes nothing: no new epoch, and the answer names the adopting round.
    again = await admin.UpdateIntervals(admin_pb2.UpdateIntervalsRequest(disable=True), metadata=served.auth)
    assert (again.config.epoch, again.adopted_round) == (2, off.adopted_round)
    on = admin_pb2.UpdateIntervalsRequest(attempt_interval=3, any_interval=9)
    assert (await admin.UpdateIntervals(on, metadata=served.auth)).config.epoch == 3
    same = await admin.UpdateIntervals(
        admin_pb2.UpdateIntervalsRequest(attempt_interval=3, any_interval=9, expected_epoch=3), metadata=served.auth
    )
    assert same.config.epoch == 3 and (await admin.GetConfig(admin_pb2.GetConfigRequest())).epoch == 3


async def test_a_refused_value_comes_back_in_startups_exact_words(served):  # rule C3
    code, error = await outcome(
        served.admin.UpdateIntervals(
            admin_pb2.UpdateIntervalsRequest(attempt_interval=0, any_interval=5), metadata=served.auth
        )
    )
    startup = "--prefill-attempt-interval must be an integer in [1, 4294967295], got 0"
    assert code == grpc.StatusCode.INVALID_ARGUMENT and error.details() == startup
    violations = bad_request(error)
    assert [(v.field, v.description) for v in violations] == [("attempt_interval", startup)]


async def test_draining_refuses_changes_and_requests(served):  # UNAVAILABLE while draining
    served.controller.request_stop()
    change = admin_pb2.UpdateIntervalsRequest(attempt_interval=2, any_interval=6)
    code, _ = await outcome(served.admin.UpdateIntervals(change, metadata=served.auth))
    assert code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in served.requests.Submit(
            requests_pb2.SubmitRequest(prompt_len=8, output_len=2), metadata=served.auth
        ):
            pass
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
