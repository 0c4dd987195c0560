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
from pathlib import Path

import grpc
import pytest

from control.cli import build_parser
from control.host.serve import build_workload
from engine.config import PrefillDelay, ServerArgs
from engine.drivers.lockstep import LockstepDriver
from engine.drivers.procs import ProcessDriver, RankRound, free_port, vote_line
from prefill_gate.v1 import admin_pb2, admin_pb2_grpc, telemetry_pb2, telemetry_pb2_grpc
from tests.test_grpc_server import self_signed

TOKEN = "node-test-token"


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
    for i in range(12):
        item = {"t": 0.0, "prompt_len": 40 + 61 * i, "output_len": 60 + 25 * (i % 5), "rank": i % 4}
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n")


def reference_votes(argv: list[str], adopted_round: int, delay: PrefillDelay, rounds: int) -> list[list[str]]:
    """The same requests in the in-process lockstep driver, the change proposed at the same round."""
    parser, _ = build_parser()
    ns = parser.parse_args(["serve", *argv])
    args = ServerArgs.from_cli_args(ns)
    workload = build_workload(ns, args)
    driver = LockstepDriver(args)
    for rank, spec in workload.due(0.0, [0] * args.dp_size):
        driver.submit(rank, spec)
    logs: list[list[str]] = [[] for _ in range(args.dp_size)]
    for round_index in range(rounds):
        if round_index == adopted_round:
            driver.propose(1, delay)  # rank 0 takes it at this round's intake; adopted after its gather
        for rank, outcome in enumerate(driver.step()):
            logs[rank].append(vote_line(outcome, driver.engines[rank].epoch))
    return logs


def test_two_nodes_vote_like_one_and_adopt_a_change_on_one_round(tmp_path: Path):  # rules R2, R6, G1
    key, cert = self_signed(tmp_path)
    trace = tmp_path / "trace.jsonl"
    write_trace(trace)
    logs0, logs1 = tmp_path / "node0", tmp_path / "node1"
    logs0.mkdir(), logs1.mkdir()
    master_port = free_port()
    secure = ["--admin-token", TOKEN, "--tls-cert", str(cert), "--tls-key", str(key), "--collective-timeout-s", "60"]
    workload = ["--arrival", "trace", "--trace", str(trace)]
    agent = Node([*ENGINE, *node_flags(master_port, 1), *secure, "--vote-log-dir", str(logs1)])
    controller = Node(
        [*ENGINE, *node_flags(master_port, 0), *secure, *workload, "--port", "0", "--vote-log-dir", str(logs0)]
    )
    try:
        port = controller.wait_for(r"control plane: grpcs://127\.0\.0\.1:(\d+)", 120).group(1)
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            watch = telemetry_pb2_grpc.GateTelemetryStub(channel).WatchRounds(telemetry_pb2.WatchRoundsRequest())
            for record in watch:
                if record.round >= 20:
                    break
            watch.cancel()
            change = admin_pb2.UpdateIntervalsRequest(attempt_interval=2, any_interval=8)
            answer = admin_pb2_grpc.GateAdminStub(channel).UpdateIntervals(
                change, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=60
            )
        assert controller.wait(120) == 0, controller.stderr
        assert agent.wait(30) == 0, agent.stderr
    finally:
        controller.kill_tree()
        agent.kill_tree()
    assert any("every rank exited; node 0 ended the run" in line for line in agent.lines)
    assert any("requests finished 12/12" in line for line in controller.lines), controller.lines
    logs = [(logs0 / "rank0.log"), (logs0 / "rank1.log"), (logs1 / "rank2.log"), (logs1 / "rank3.log")]
    votes = [path.read_text().splitlines() for path in logs]
    assert votes[0] == votes[1] == votes[2] == votes[3]  # both nodes, every round (R2)
    epochs = [int(line.split()[5]) for line in votes[0]]
    adopted = answer.adopted_round
    assert epochs.index(1) == adopted and 20 <= adopted < len(epochs) - 1  # one round, both nodes (G1)
    assert set(epochs[:adopted]) == {0} and set(epochs[adopted:]) == {1}
    assert answer.config.attempt_interval == 2 and answer.config.any_interval == 8
    # The vote log as a function of the requests and the adoption round: one node, one process, same votes.
    reference = reference_votes([*ENGINE, *workload], adopted, PrefillDelay(2, 8), len(votes[0]))
    assert reference == votes
    points = {line.split()[1] for line in votes[0][:adopted]}
    assert {"1", "2"} <= points  # the run went through ANY and ALL points before the change


@pytest.mark.parametrize("victim", [1, 0], ids=["agent", "controller"])
def test_a_killed_node_ends_both_trees_nonzero_without_orphans(tmp_path: Path, victim: int):  # issue 16, item 3
    timeout_s = 20.0
    master_port = free_port()
    # One rank per node: what fails here is a node, and fewer processes start faster.
    common = [*engine_flags(2), "--collective-timeout-s", str(timeout_s), "--vote-log-dir", str(tmp_path)]
    agent = Node([*common, *node_flags(master_port, 1)])
    controller = Node([*common, *node_flags(master_port, 0), "--port", "0", "--keep-serving", "--arrival", "none"])
    nodes = [controller, agent]
    try:
        agent.wait_for(r"agent at grpc://", 120)
        controller.wait_for(r"control plane: grpc://", 120)
        deadline = time.monotonic() + 60
        while not (tmp_path / "rank1.log").exists() or len((tmp_path / "rank1.log").read_text().splitlines()) < 5:
            assert time.monotonic() < deadline, "no rounds on node 1"
            time.sleep(0.05)
        killed_at = time.monotonic()
        os.kill(nodes[victim].process.pid, signal.SIGKILL)
        survivor = nodes[1 - victim]
        code = survivor.wait(timeout_s + 30)
        took = time.monotonic() - killed_at
        nodes[victim].wait(10)
        left = no_orphans_within([controller.process.pid, agent.process.pid], 15)
    finally:
        controller.kill_tree()
        agent.kill_tree()
    assert nodes[victim].process.returncode == -signal.SIGKILL
    assert code == 1 and took < timeout_s, (code, took, survivor.stderr)
    named = "node 1 (rank 1) failed" if victim == 1 else "node 1 (rank 1): lost the link to node 0"
    assert named in survivor.stderr and "Traceback" not in survivor.stderr
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


def test_go_rebases_a_ranks_wall_clock_on_node_0s():
    """A remote node's ranks start on their own machine's clock; `Go` carries node 0's engine clock and
    the rank re-bases on it, so its event times (TTFT, ITL) read on node 0's clock."""
    from engine.request import Finished, FirstToken, Submit
    from tests.test_torch_executor import spec, torch_args

    driver = ProcessDriver(torch_args(dp_size=1), idle_wait_s=0.001)
    events = []
    try:
        driver.start(go=False)
        driver.send(0, Submit(spec("late", 6, 3)))
        node0_clock = 1000.0  # node 0 has been running for 1000 s
        driver.go(time.perf_counter() - node0_clock)  # the agent's origin for GoCommand(clock=1000)
        deadline = time.monotonic() + 120
        while not any(isinstance(e, Finished) for e in events):
            assert time.monotonic() < deadline, events
            events += [e for m in driver.poll_events(0.05) if isinstance(m, RankRound) for e in m.events]
            driver.raise_if_failed()
    finally:
        driver.terminate()
    first = next(e for e in events if isinstance(e, FirstToken))
    assert node0_clock <= first.time < node0_clock + 60
