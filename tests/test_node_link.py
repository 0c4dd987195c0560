"""The node transport without rank processes: its messages, its plan, and how an agent refuses a link."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.cli import build_parser
from control.host.nodes import node_plan
from control.plane.auth import BearerTokenInterceptor
from engine.config import PrefillDelay, ServerArgs
from engine.drivers.agent import NodeAgentService
from engine.drivers.cluster import (
    LINK_METHOD,
    NodeFailure,
    NodeLayout,
    RemoteNode,
    args_difference,
    shared_flags,
)
from engine.drivers.procs import ProcessDriver, RankExited, RankFailed, RankReady, RankRound
from engine.drivers.wire import command_from_pb, command_to_pb, event_from_pb, event_to_pb, report_from_pb, report_to_pb
from engine.request import (
    Abort,
    AbortIgnored,
    Admitted,
    ChunkPlanned,
    Finished,
    FinishReason,
    FirstToken,
    ProposalRefused,
    ProposeConfig,
    Refused,
    RequestSpec,
    Retracted,
    Stop,
    Submit,
    Tokens,
    UpdateWeights,
)
from prefill_gate.v1 import nodes_pb2 as pb
from prefill_gate.v1 import nodes_pb2_grpc
from tests.helpers import sim_args

ids = st.text(min_size=1, max_size=12)
ranks = st.integers(0, 63)
rounds = st.integers(0, 2**40)
times = st.floats(0, 1e6, allow_nan=False)
events = st.one_of(
    st.builds(Admitted, ids, ranks, rounds, times, rounds, times),
    st.builds(ChunkPlanned, ids, ranks, rounds, st.integers(1, 2**20)),
    st.builds(FirstToken, ids, ranks, rounds, times),
    st.builds(Tokens, ids, st.lists(st.integers(0, 2**31 - 1), max_size=5).map(tuple)),
    st.builds(Finished, ids, ranks, rounds, times, st.sampled_from(FinishReason), st.integers(0, 2**20)),
    st.builds(Refused, ids, ranks, st.text(max_size=40)),
    st.builds(AbortIgnored, ids, ranks),
    st.builds(Retracted, ids, ranks, rounds),
    st.builds(ProposalRefused, st.integers(0, 2**40), st.text(max_size=40), st.text(max_size=12)),
)
specs = st.builds(
    RequestSpec,
    ids,
    st.integers(1, 4096),
    st.integers(1, 4096),
    times,
    st.one_of(st.none(), st.lists(st.integers(0, 50_000), min_size=1, max_size=6).map(tuple)),
    st.integers(0, 100),
)
commands = st.one_of(
    st.builds(Submit, specs),
    st.builds(Abort, ids),
    st.just(UpdateWeights()),
    st.builds(
        ProposeConfig,
        st.integers(1, 2**40),
        st.one_of(st.none(), st.builds(PrefillDelay, st.integers(1, 64), st.integers(64, 4096))),
    ),
    st.just(Stop()),
)
reports = st.one_of(
    st.builds(RankReady, ranks, st.integers(1, 2**22)),
    st.builds(RankRound, ranks, rounds, st.lists(events, max_size=4), st.lists(st.tuples(times, st.integers(1, 64)))),
    st.builds(RankFailed, ranks, st.text(max_size=30), st.text(max_size=60)),
    st.builds(RankExited, ranks, rounds, rounds, st.dictionaries(st.text(max_size=8), times, max_size=3), rounds),
)


@settings(max_examples=40, deadline=None)
@given(events)
def test_every_request_event_crosses_a_link_unchanged(event):  # request events are never altered or lost
    assert event_from_pb(pb.RankRequestEvent.FromString(event_to_pb(event).SerializeToString())) == event


@settings(max_examples=40, deadline=None)
@given(ranks, commands)
def test_every_rank_command_crosses_a_link_unchanged(rank, command):
    assert command_from_pb(pb.NodeCommand.FromString(command_to_pb(rank, command).SerializeToString())) == (
        rank,
        command,
    )


@settings(max_examples=40, deadline=None)
@given(reports)
def test_every_rank_report_crosses_a_link_unchanged(report):
    assert report_from_pb(pb.NodeReport.FromString(report_to_pb(report).SerializeToString())) == report


def test_layouts_split_ranks_by_node():
    assert NodeLayout.even(8, 2, 1).ranks == (4, 5, 6, 7)
    assert NodeLayout.even(8, 2, 1).describe(0) == "node 0 (ranks 0-3)"
    assert NodeLayout.one_rank_each(4, 2).nodes == ((0,), (1,), (2,), (3,))
    with pytest.raises(ValueError, match="divisible by --nnodes"):
        NodeLayout.even(6, 4, 0)
    with pytest.raises(ValueError, match=r"--node-rank must be in \[0, 2\)"):
        NodeLayout.even(4, 2, 2)


def parse(*argv: str):
    parser, _ = build_parser()
    ns = parser.parse_args(["serve", "--executor", "sim", "--processes", "--enable-dp-attention", *argv])
    return ns, ServerArgs.from_cli_args(ns)


NODE = ("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29500")


def test_the_node_flags_make_a_plan():
    plan, _ = node_plan(*parse("--dp-size", "4", *NODE, "--node-rank", "1"), environ={})
    assert plan is not None and not plan.is_controller and plan.layout.ranks == (2, 3)
    assert plan.init_method == "store://127.0.0.1:29500/prefill_gate/ranks" and not plan.host_store
    assert plan.node_addr == "127.0.0.1"  # the interface toward the master address
    plan0, _ = node_plan(*parse("--dp-size", "4", *NODE), environ={})
    assert plan0 is not None and plan0.is_controller and plan0.host_store
    assert node_plan(*parse("--dp-size", "4"), environ={})[0] is None  # one node: no plan


def test_under_torchrun_every_worker_hosts_its_rank():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}
    plan, args = node_plan(*parse("--max-num-seqs", "64"), environ={**env, "TORCHELASTIC_RUN_ID": "x"})
    assert plan is not None and plan.torchrun and plan.layout.ranks == (3,) and not plan.is_controller
    assert args.dp_size == 4 and plan.init_method == "env://" and not plan.host_store  # torchrun's store
    assert plan.first_local_rank == 1  # LOCAL_RANK picks the GPU
    with pytest.raises(ValueError, match="WORLD_SIZE=4"):
        node_plan(*parse("--dp-size", "2"), environ=env)
    with pytest.raises(ValueError, match="come from its environment"):
        node_plan(*parse("--dp-size", "4", *NODE), environ=env)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--dp-size", "4", "--nnodes", "2"), "needs --master-addr and --master-port"),
        (("--dp-size", "3", *NODE), r"--dp-size \(3\) must be divisible by --nnodes \(2\)"),
        (("--dp-size", "4", "--node-rank", "1"), "needs --nnodes > 1"),
        (("--dp-size", "4", *NODE, "--master-port", "70000"), r"--master-port must be in \[1, 65535\]"),
        (("--dp-size", "4", *NODE, "--rendezvous-timeout-s", "0"), "--rendezvous-timeout-s must be > 0"),
    ],
)
def test_bad_node_flags_are_named(argv, message):  # rule C2: a clear error, nothing started
    with pytest.raises(ValueError, match=message):
        node_plan(*parse(*argv), environ={})


def test_the_in_process_simulator_cannot_span_nodes():
    parser, _ = build_parser()
    ns = parser.parse_args(["serve", "--executor", "sim", "--dp-size", "4", *NODE])
    with pytest.raises(ValueError, match="--executor sim --processes"):
        node_plan(ns, ServerArgs.from_cli_args(ns), environ={})


async def start_agent(args: ServerArgs, layout: NodeLayout, token: str | None):
    driver = ProcessDriver(args, ranks=layout.ranks)  # never launched: a refusal touches no rank
    service = NodeAgentService(driver, layout, args)
    server = grpc.aio.server(interceptors=[BearerTokenInterceptor(token, {LINK_METHOD})] if token else [])
    nodes_pb2_grpc.add_NodeAgentServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, service, f"127.0.0.1:{port}"


def hello_for(args: ServerArgs, layout: NodeLayout, node: int) -> pb.LinkHello:
    import json

    return pb.LinkHello(
        run_id="t",
        node=node,
        nnodes=layout.nnodes,
        ranks=layout.nodes[node],
        server_args_json=json.dumps(shared_flags(args, None)),
    )


async def link(target: str, hello: pb.LinkHello, token: str | None) -> str:
    remote = RemoteNode(hello.node, tuple(hello.ranks), target, token=token)
    try:
        await asyncio.to_thread(remote.open, hello, 20.0)
    except NodeFailure as exc:
        return str(exc)
    finally:
        remote.close(failed=True, reason="test over", timeout_s=2)
    return "linked"


async def test_an_agent_refuses_other_flags_a_wrong_token_and_a_second_link():
    args = sim_args(dp_size=4, prefill_attempt_interval=4, prefill_any_attempt_interval=16)
    layout = NodeLayout.even(4, 2, 1)
    server, service, target = await start_agent(args, layout, token="right")
    try:
        wrong_token = await link(target, hello_for(args, layout, 1), token="wrong")
        assert wrong_token.startswith("node 1 (ranks 2-3) failed: its agent at")
        assert "refused node 0's token (PERMISSION_DENIED" in wrong_token
        other = dataclasses.replace(args, prefill_attempt_interval=8)
        refused = await link(target, hello_for(other, layout, 1), token="right")
        assert "its agent refused the link: engine flags differ from node 0's" in refused
        assert "--prefill-attempt-interval (node 0: 8, this node: 4)" in refused
        assert service.done.done() and "refused node 0's link" in service.done.result()  # the agent gives up too
        again = await link(target, hello_for(args, layout, 1), token="right")
        assert "ALREADY_EXISTS" in again  # one run per agent
    finally:
        await server.stop(0)
        service.driver.terminate()


async def test_an_agent_refuses_a_link_meant_for_another_node():
    args = sim_args(dp_size=4)
    server, service, target = await start_agent(args, NodeLayout.even(4, 2, 1), token=None)
    try:
        wrong = await link(target, hello_for(args, NodeLayout.even(4, 4, 0), 2), token=None)
        assert "node 0 expects node 2 of 4, this agent is node 1 of 2" in wrong
    finally:
        await server.stop(0)
        service.driver.terminate()


def test_nodes_must_agree_on_the_round_bound_too():  # every rank stops after the same round
    args = sim_args(dp_size=4)
    assert args_difference(shared_flags(args, None), shared_flags(args, 100)) == [
        "--rounds (node 0: 100, this node: None)"
    ]
    assert args_difference(shared_flags(args, 100), shared_flags(args, 100)) == []


def test_every_field_of_every_event_and_report_has_a_wire_field():  # a field the link would drop fails here
    from engine.drivers.wire import EVENT_FIELDS

    carriers = {cls: getattr(pb, "Rank" + cls.__name__) for cls in EVENT_FIELDS}
    carriers |= {RankReady: pb.RankReadyReport, RankRound: pb.RankRoundReport, RankFailed: pb.RankFailedReport}
    carriers |= {RankExited: pb.RankExitedReport}
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls, message in carriers.items()
        for f in dataclasses.fields(cls)
        if f.name not in message.DESCRIPTOR.fields_by_name
    ]
    assert missing == []


def test_every_event_and_command_type_has_a_wire_form():  # a new engine type fails here, not on a node
    import typing

    from engine.drivers.wire import EVENT_FIELDS
    from engine.request import Command, RequestEvent

    assert set(typing.get_args(RequestEvent)) == set(EVENT_FIELDS)
    commands = {Submit: Submit(RequestSpec("r", 1, 1)), Abort: Abort("r"), ProposeConfig: ProposeConfig(1, None)}
    commands |= {UpdateWeights: UpdateWeights(), Stop: Stop()}
    assert set(typing.get_args(Command)) == set(commands)
    for command in commands.values():
        assert command_from_pb(command_to_pb(0, command)) == (0, command)


async def test_an_agent_whose_link_node_0_cuts_says_it_lost_the_link():
    # Node 0 hangs up without ending the run (its controller died): the agent's run is over, and says why.
    args = sim_args(dp_size=4)
    layout = NodeLayout.even(4, 2, 1)
    server, service, target = await start_agent(args, layout, token=None)
    hung_up = asyncio.Event()

    async def commands():
        yield pb.NodeCommand(hello=hello_for(args, layout, 1))
        await hung_up.wait()

    channel = grpc.aio.insecure_channel(target)
    try:
        call = nodes_pb2_grpc.NodeAgentStub(channel).Link(commands())
        assert (await call.read()).WhichOneof("report") == "hello"
        await asyncio.sleep(0.2)
        assert not service.done.done()
        call.cancel()
        hung_up.set()
        outcome = await asyncio.wait_for(asyncio.shield(service.done), 10)
        assert outcome is not None and outcome.startswith("lost the link to node 0")
    finally:
        await channel.close()
        await server.stop(0)
        service.driver.terminate()
