"""GateRequests over a real server: what a Submit stream carries, Abort, and a client that goes away."""

from __future__ import annotations

import asyncio

import grpc

from control.host.backends import ProcessBackend
from engine.config import ServerArgs
from prefill_gate.v1 import requests_pb2
from tests.grpc_plane import serving
from tests.helpers import sim_args

ARGS = sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6)


async def events_of(call) -> list[requests_pb2.SubmitEvent]:
    return [event async for event in call]


async def test_submit_streams_accepted_first_token_and_finish():  # TTFT, gate wait, finish reason
    async with serving(ARGS, pace=1.0) as served:
        request = requests_pb2.SubmitRequest(request_id="mine", prompt_len=200, output_len=6, prefix_hit=64, rank=1)
        events = await asyncio.wait_for(events_of(served.requests.Submit(request, metadata=served.auth)), 20)
        assigned = await asyncio.wait_for(
            events_of(
                served.requests.Submit(requests_pb2.SubmitRequest(prompt_len=8, output_len=1), metadata=served.auth)
            ),
            20,
        )
        duplicate = requests_pb2.SubmitRequest(request_id="twice", prompt_len=8, output_len=50)
        first = served.requests.Submit(duplicate, metadata=served.auth)
        await first.read()
        again = served.requests.Submit(duplicate, metadata=served.auth)
        code = await again.code()
        first.cancel()
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds == ["accepted", "first_token", "finished"]  # the simulator samples no token ids
    assert (events[0].accepted.request_id, events[0].accepted.rank) == ("mine", 1)
    first_token, finished = events[1].first_token, events[2].finished
    assert first_token.ttft_seconds > 0 and first_token.round > 0
    assert finished.reason == "length" and finished.output_len == 6
    assert finished.ttft_seconds == first_token.ttft_seconds < finished.e2e_seconds
    assert finished.gate_wait_rounds >= 0 and finished.gate_wait_seconds >= 0
    assert assigned[0].accepted.request_id.startswith("req-") and assigned[-1].finished.output_len == 1
    assert code == grpc.StatusCode.ALREADY_EXISTS


async def test_abort_ends_the_stream_and_a_cancelled_client_aborts_its_request():
    async with serving(ARGS, pace=1.0) as served:
        long = requests_pb2.SubmitRequest(request_id="long", prompt_len=32, output_len=2000)
        call = served.requests.Submit(long, metadata=served.auth)
        assert (await call.read()).HasField("accepted")
        aborted = await served.requests.Abort(requests_pb2.AbortRequest(request_id="long"), metadata=served.auth)
        events = []
        while (event := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
            events.append(event)
        again = await served.requests.Abort(requests_pb2.AbortRequest(request_id="long"), metadata=served.auth)

        gone = served.requests.Submit(
            requests_pb2.SubmitRequest(request_id="gone", prompt_len=32, output_len=2000), metadata=served.auth
        )
        await gone.read()
        gone.cancel()  # nobody will read its tokens: the server aborts it
        async with asyncio.timeout(10):  # both requests end as aborted on their ranks
            while served.controller.summary().requests_aborted < 2:
                await asyncio.sleep(0.01)
        assert not served.controller.abort("gone")  # no longer live
    assert aborted.found and not again.found
    assert events[-1].finished.reason == "abort"


async def test_a_torch_rank_streams_its_token_ids():  # TokenBatch: only executors that sample tokens
    args = ServerArgs(executor="torch", dp_size=1, max_num_seqs=4, kv_pages=64, chunked_prefill_size=64)
    async with serving(args, backend=ProcessBackend(args)) as served:
        request = requests_pb2.SubmitRequest(prompt=[1, 2, 3, 4, 5], output_len=4)
        events = await asyncio.wait_for(events_of(served.requests.Submit(request, metadata=served.auth)), 60)
    tokens = [t for event in events if event.HasField("tokens") for t in event.tokens.tokens]
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[:2] == ["accepted", "first_token"] and kinds[-1] == "finished"
    assert len(tokens) == 4 and all(0 <= t < args.model_vocab for t in tokens)
    assert events[-1].finished.output_len == 4
