"""Ranks across nodes on loopback: two `serve` process trees, a link over gRPC, failures (issue 16).

Node 0 runs the controller, the control plane and ranks 0-1; node 1 runs an agent for ranks 2-3. The
ranks use the simulator executor on its virtual clock, so a run's votes are a function of its
requests and of the round a config change is adopted on: the in-process lockstep driver, given the
same requests and the change at the same round, must log the very same votes (rules R2, R6, G1).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from control.cli import build_parser
from control.host.serve import build_workload
from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.drivers.procs import free_port, vote_line
from engine.request import Finished
from prefill_gate.v1 import admin_pb2, admin_pb2_grpc, telemetry_pb2, telemetry_pb2_grpc
from tests.test_grpc_server import self_signed

TOKEN = "node-test-token"
REQUESTS = 12


def engine_flags(dp_size: int) -> list[str]:
    """Simulated ranks as processes, the gate on: the same on every node."""
    return [
        *("--executor", "sim", "--processes", "--dp-size", str(dp_size), "--enable-dp-attention"),
        *("--prefill-attempt-interval", "4", "--prefill-any-attempt-interval", "16"),
        *("--chunked-prefill-size", "256", "--max-num-seqs", "64"),
    ]


ENGINE = engine_flags(4)


class Node:
    """One `prefill-gate serve` process tree in its own session (its process group id is its pid)."""

    def __init__(self, argv: list[str]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "control.cli", "serve", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [
            threading.Thread(target=self._pump, args=(self.process.stdout, self.lines), daemon=True),
            threading.Thread(target=self._pump, args=(self.process.stderr, self.errors), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _pump(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                found = re.search(pattern, line)
                if found:
                    return found
            if self.process.poll() is not None and not any(r.is_alive() for r in self._readers[:1]):
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}; out={self.lines} err={self.errors}")

    def wait(self, timeout_s: float) -> int:
        code = self.process.wait(timeout_s)
        for reader in self._readers:
            reader.join(5)
        return code

    @property
    def stderr(self) -> str:
        return "\n".join(self.errors)

    def kill_tree(self) -> None:
        with_pids = processes_in_group(self.process.pid)
        for pid in with_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def processes_in_group(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (a /proc scan; zombies count as gone)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            out.append(int(entry.name))
    return out


def no_orphans_within(pgids: list[int], timeout_s: float) -> list[int]:
    """Processes still alive in any of `pgids` after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for pgid in pgids for pid in processes_in_group(pgid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def node_flags(master_port: int, node: int) -> list[str]:
    return [
        *("--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1"),
        *("--master-port", str(master_port), "--no-progress"),
    ]


def write_trace(path: Path) -> None:
    """Every request at t=0, pinned to a rank: all reach round 0, on every node alike."""
    lines = []
    for i in range(REQUESTS):
        item = {"t": 0.0, "prompt_len": 40 + 61 * i, "output_len": 60 + 25 * (i % 5), "rank": i % 4}
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n")


def reference_votes(
    argv: list[str], adopted_round: int, delay: PrefillDelay, rounds: int
) -> tuple[list[list[str]], int]:
    """The same requests in the in-process lockstep driver, the change proposed at the same round:
    every rank's vote log, and how many requests finished within `rounds` rounds."""
    parser, _ = build_parser()
    ns = parser.parse_args(["serve", *argv])
    args = ServerArgs.from_cli_args(ns)
    workload = build_workload(ns, args)
    driver = LockstepDriver(args)
    for rank, spec in workload.due(0.0, [0] * args.dp_size):
        driver.submit(rank, spec)
    logs: list[list[str]] = [[] for _ in range(args.dp_size)]
    finished = 0
    for round_index in range(rounds):
        if round_index == adopted_round:
            driver.propose(1, delay)  # rank 0 takes it at this round's intake; adopted after its gather
        for rank, outcome in enumerate(driver.step()):
            logs[rank].append(vote_line(outcome, driver.engines[rank].epoch))
            finished += sum(isinstance(event, Finished) for event in outcome.events)
    return logs, finished


@dataclass
class TwoNodeRun:
    """What one loopback run of two 2-rank node trees showed, ended by `kill -9` of node 1's agent."""

    votes: list[list[str]]  # ranks 0-3, the rounds every rank logged before the kill
    answer: admin_pb2.UpdateIntervalsResponse
    finished_before_kill: int
    agent_code: int | None
    controller_code: int | None
    took_s: float  # from the kill to node 0's exit
    controller_stderr: str
    watch_end: grpc.StatusCode | None  # how a WatchRounds open at the kill ended
    orphans: list[int]
    argv: list[str]  # node 0's engine and workload flags, for the reference run


COLLECTIVE_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> TwoNodeRun:
    """Both must-show node scenarios on one set of process trees (the start is most of a node test's
    time): serve the requests, change the intervals mid-run, then `kill -9` node 1's agent."""
    tmp_path = tmp_path_factory.mktemp("two-nodes")
    key, cert = self_signed(tmp_path)
    trace = tmp_path / "trace.jsonl"
    write_trace(trace)
    logs0, logs1 = tmp_path / "node0", tmp_path / "node1"
    logs0.mkdir(), logs1.mkdir()
    master_port = free_port()
    secure = ["--admin-token", TOKEN, "--tls-cert", str(cert), "--tls-key", str(key)]
    common = [*ENGINE, *secure, "--collective-timeout-s", str(COLLECTIVE_TIMEOUT_S)]
    workload = ["--arrival", "trace", "--trace", str(trace)]
    agent = Node([*common, *node_flags(master_port, 1), "--vote-log-dir", str(logs1)])
    node0 = [*workload, "--port", "0", "--keep-serving", "--vote-log-dir", str(logs0)]
    controller = Node([*common, *node_flags(master_port, 0), *node0])
    auth = (("authorization", f"Bearer {TOKEN}"),)
    watch_end: list[grpc.StatusCode] = []
    try:
        port = controller.wait_for(r"control plane: grpcs://127\.0\.0\.1:(\d+)", 120).group(1)
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            telemetry = telemetry_pb2_grpc.GateTelemetryStub(channel)
            watch = telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest())
            for record in watch:
                if record.round >= 20:
                    break
            watch.cancel()
            change = admin_pb2.UpdateIntervalsRequest(attempt_interval=2, any_interval=8)
            answer = admin_pb2_grpc.GateAdminStub(channel).UpdateIntervals(change, metadata=auth, timeout=60)
            deadline = time.monotonic() + 120
            snapshot = telemetry_pb2.GetSnapshotRequest()
            while (finished := telemetry.GetSnapshot(snapshot).stats.requests_finished) < REQUESTS:
                assert time.monotonic() < deadline and controller.process.poll() is None, controller.stderr
                time.sleep(0.1)
            streaming = threading.Event()
            watcher = threading.Thread(target=_watch_to_the_end, args=(telemetry, streaming, watch_end), daemon=True)
            watcher.start()
            assert streaming.wait(30), "the watch opened before the kill streamed nothing"
            killed_at = time.monotonic()
            os.kill(agent.process.pid, signal.SIGKILL)
            controller_code = controller.wait(COLLECTIVE_TIMEOUT_S + 30)
            took = time.monotonic() - killed_at
            watcher.join(30)
        agent_code = agent.wait(10)
        orphans = no_orphans_within([controller.process.pid, agent.process.pid], 15)
    finally:
        controller.kill_tree()
        agent.kill_tree()
    logs = [logs0 / "rank0.log", logs0 / "rank1.log", logs1 / "rank2.log", logs1 / "rank3.log"]
    per_rank = [path.read_text().splitlines() for path in logs]
    logged = min(len(lines) for lines in per_rank)
    return TwoNodeRun(
        votes=[lines[:logged] for lines in per_rank],
        answer=answer,
        finished_before_kill=finished,
        agent_code=agent_code,
        controller_code=controller_code,
        took_s=took,
        controller_stderr=controller.stderr,
        watch_end=watch_end[0] if watch_end else None,
        orphans=orphans,
        argv=[*ENGINE, *workload],
    )


def _watch_to_the_end(
    telemetry: telemetry_pb2_grpc.GateTelemetryStub, streaming: threading.Event, end: list[grpc.StatusCode]
) -> None:
    try:
        for _ in telemetry.WatchRounds(telemetry_pb2.WatchRoundsRequest()):
            streaming.set()
        end.append(grpc.StatusCode.OK)
    except grpc.RpcError as exc:
        end.append(exc.code())


def test_two_nodes_vote_like_one_and_adopt_a_change_on_one_round(two_node_run: TwoNodeRun):  # rules R2, R6, G1
    run = two_node_run
    votes = run.votes
    assert votes[0] == votes[1] == votes[2] == votes[3]  # both nodes, every round (R2)
    epochs = [int(line.split()[5]) for line in votes[0]]
    adopted = run.answer.adopted_round
    assert epochs.index(1) == adopted and 20 <= adopted < len(epochs) - 1  # one round, both nodes (G1)
    assert set(epochs[:adopted]) == {0} and set(epochs[adopted:]) == {1}
    assert run.answer.config.attempt_interval == 2 and run.answer.config.any_interval == 8
    # Every request event crossed the link: node 0's controller counted each request's end.
    assert run.finished_before_kill == REQUESTS
    # The vote log as a function of the requests and the adoption round: one node, one process, same votes.
    reference, finished = reference_votes(run.argv, adopted, PrefillDelay(2, 8), len(votes[0]))
    assert reference == votes
    assert finished == REQUESTS  # the compared rounds cover the whole workload
    points = {line.split()[1] for line in votes[0][:adopted]}
    assert {"1", "2"} <= points  # the run went through ANY and ALL points before the change


def test_killing_node_1s_agent_ends_both_trees_nonzero_without_orphans(two_node_run: TwoNodeRun):  # issue 16
    run = two_node_run
    assert run.agent_code == -signal.SIGKILL
    assert run.controller_code == 1 and run.took_s < COLLECTIVE_TIMEOUT_S, (run.took_s, run.controller_stderr)
    assert "node 1 (ranks 2-3) failed" in run.controller_stderr and "Traceback" not in run.controller_stderr
    assert run.orphans == []  # no rank of either node outlives its tree
    assert run.watch_end not in (None, grpc.StatusCode.OK)  # the control plane's client sees a failure


def test_a_killed_controller_ends_node_1_nonzero_without_orphans(tmp_path: Path):  # issue 16, item 3
    timeout_s = COLLECTIVE_TIMEOUT_S
    master_port = free_port()
    # One rank per node: what fails here is a node, and fewer processes start faster.
    common = [*engine_flags(2), "--collective-timeout-s", str(timeout_s), "--vote-log-dir", str(tmp_path)]
    agent = Node([*common, *node_flags(master_port, 1)])
    controller = Node([*common, *node_flags(master_port, 0), "--port", "0", "--keep-serving", "--arrival", "none"])
    try:
        agent.wait_for(r"agent at grpc://", 120)
        controller.wait_for(r"control plane: grpc://", 120)
        deadline = time.monotonic() + 60
        while not (tmp_path / "rank1.log").exists() or len((tmp_path / "rank1.log").read_text().splitlines()) < 5:
            assert time.monotonic() < deadline, "no rounds on node 1"
            time.sleep(0.05)
        killed_at = time.monotonic()
        os.kill(controller.process.pid, signal.SIGKILL)
        code = agent.wait(timeout_s + 30)
        took = time.monotonic() - killed_at
        controller.wait(10)
        left = no_orphans_within([controller.process.pid, agent.process.pid], 15)
    finally:
        controller.kill_tree()
        agent.kill_tree()
    assert controller.process.returncode == -signal.SIGKILL
    assert code == 1 and took < timeout_s, (code, took, agent.stderr)
    assert "node 1 (rank 1): lost the link to node 0" in agent.stderr and "Traceback" not in agent.stderr
    assert left == []


def test_ctrl_c_while_node_0_waits_for_an_agent_ends_it_at_once(tmp_path: Path):
    """Node 0 blocks its event loop while the other nodes join; a Ctrl-C there still ends it, naming
    what it waited for, and leaves no rank behind."""
    controller = Node([*engine_flags(2), *node_flags(free_port(), 0), "--port", "0"])
    try:
        controller.wait_for(r"waiting for node 1 \(rank 1\): its agent's address in the rendezvous store", 120)
        os.kill(controller.process.pid, signal.SIGINT)
        code = controller.wait(30)
        left = no_orphans_within([controller.process.pid], 15)
    finally:
        controller.kill_tree()
    assert code == 1 and "error: interrupted by SIGINT while waiting for node 1 (rank 1)" in controller.stderr
    assert "stopping" not in "\n".join(controller.lines) and left == []
