"""`serve` across nodes: the flags, the plan they make (native or torchrun), node 0's backend.

    node 0:  prefill-gate serve --dp-size 16 --nnodes 2 --node-rank 0 --master-addr A --master-port P ...
    node 1:  prefill-gate serve --dp-size 16 --nnodes 2 --node-rank 1 --master-addr A --master-port P ...

Node 0 runs the controller, the gRPC control plane and ranks 0..7; node 1 runs an agent for ranks
8..15 (`control/host/agent.py`). Under torchrun every worker hosts its one rank: the worker with RANK 0
is node 0, every other worker is an agent (README "Several nodes").
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from engine.config import ServerArgs
from engine.drivers.cluster import (
    RANKS_PREFIX,
    ClusterDriver,
    NodeDirectory,
    NodeLayout,
    route_address,
    torchrun_env,
)
from engine.group import STORE_SCHEME


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """`serve`'s flags for ranks on several machines."""
    group = parser.add_argument_group("several nodes (under torchrun these come from its environment)")
    group.add_argument("--nnodes", type=int, default=None, help="machines the --dp-size ranks are spread over")
    group.add_argument("--node-rank", type=int, default=None, help="this machine's index; 0 runs the controller")
    group.add_argument("--master-addr", default=None, help="node 0's address: the rendezvous store's host")
    group.add_argument("--master-port", type=int, default=None, help="port of the rendezvous store on node 0")
    group.add_argument(
        "--node-addr",
        default=None,
        help="address this node's agent binds and advertises (default: the interface toward --master-addr)",
    )
    group.add_argument("--node-port", type=int, default=0, help="port of this node's agent (default: a free one)")
    group.add_argument(
        "--rendezvous-timeout-s",
        type=float,
        default=300.0,
        help="how long nodes wait for each other at start (default: %(default)s)",
    )
    group.add_argument(
        "--vote-log-dir",
        default=None,
        metavar="DIR",
        help="rank processes of this node write a line per round (round, point, open, counters, epoch) "
        "to DIR/rank<R>.log",
    )


@dataclass(frozen=True)
class NodePlan:
    """How this process takes part in a group spread over nodes."""

    layout: NodeLayout
    master_addr: str
    master_port: int
    init_method: str  # how the ranks join (torch's rendezvous)
    host_store: bool  # this process hosts the TCPStore (node 0 without torchrun)
    store_prefix: str
    node_addr: str
    node_port: int
    rendezvous_timeout_s: float
    torchrun: bool
    first_local_rank: int = 0  # LOCAL_RANK under torchrun: which GPU this node's one rank uses

    @property
    def is_controller(self) -> bool:
        return self.layout.node == 0

    def directory(self) -> NodeDirectory:
        """The rendezvous store, hosted (node 0 without torchrun) or joined."""
        return NodeDirectory(
            self.master_addr,
            self.master_port,
            host_store=self.host_store,
            timeout_s=self.rendezvous_timeout_s,
            prefix=self.store_prefix,
        )


def node_plan(
    ns: argparse.Namespace, args: ServerArgs, environ: dict[str, str] | None = None
) -> tuple[NodePlan | None, ServerArgs]:
    """The plan the flags (or torchrun's environment) describe, and the args with torchrun's world
    size; (None, args) for a one-node run. Raises ValueError naming the flag."""
    nnodes = getattr(ns, "nnodes", None)
    node_flags = [flag for flag, v in (("--nnodes", nnodes), ("--node-rank", getattr(ns, "node_rank", None))) if v]
    env = torchrun_env(environ if environ is not None else dict(os.environ))
    timeout = getattr(ns, "rendezvous_timeout_s", 300.0)
    if not timeout > 0:
        raise ValueError(f"--rendezvous-timeout-s must be > 0, got {timeout}")
    if env is not None:
        if node_flags or ns.master_addr or ns.master_port:
            raise ValueError(
                "under torchrun the node flags come from its environment: drop --nnodes, --node-rank, --master-*"
            )
        world = int(env["world_size"])
        if args.dp_size not in (1, world):
            raise ValueError(f"--dp-size {args.dp_size}, but torchrun started WORLD_SIZE={world} workers (a rank each)")
        if world == 1:
            return None, args
        args = args.replace(dp_size=world) if args.dp_size != world else args
        _check_processes(ns, args)
        layout = NodeLayout.one_rank_each(world, int(env["rank"]))
        master_addr, master_port = str(env["master_addr"]), int(env["master_port"])
        return NodePlan(
            layout=layout,
            master_addr=master_addr,
            master_port=master_port,
            init_method="env://",
            host_store=False,  # torchrun's agent hosts it
            store_prefix=f"attempt{env['restart']}/",
            node_addr=ns.node_addr or _advertised(master_addr, master_port),
            node_port=ns.node_port,
            rendezvous_timeout_s=timeout,
            torchrun=True,
            first_local_rank=int(env["local_rank"]),
        ), args
    if not nnodes or nnodes == 1:
        if getattr(ns, "node_rank", None):
            raise ValueError(f"--node-rank {ns.node_rank} needs --nnodes > {ns.node_rank}")
        return None, args
    if ns.master_addr is None or ns.master_port is None:
        raise ValueError("--nnodes > 1 needs --master-addr and --master-port (node 0's rendezvous store)")
    if not 0 < ns.master_port <= 65535:
        raise ValueError(f"--master-port must be in [1, 65535], got {ns.master_port}")
    if not 0 <= ns.node_port <= 65535:
        raise ValueError(f"--node-port must be in [0, 65535], got {ns.node_port}")
    _check_processes(ns, args)
    layout = NodeLayout.even(args.dp_size, nnodes, ns.node_rank or 0)
    host = f"[{ns.master_addr}]" if ":" in ns.master_addr else ns.master_addr
    return NodePlan(
        layout=layout,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        init_method=f"{STORE_SCHEME}{host}:{ns.master_port}/{RANKS_PREFIX}",
        host_store=layout.node == 0,
        store_prefix="",
        node_addr=ns.node_addr or _advertised(ns.master_addr, ns.master_port),
        node_port=ns.node_port,
        rendezvous_timeout_s=timeout,
        torchrun=False,
    ), args


def _check_processes(ns: argparse.Namespace, args: ServerArgs) -> None:
    if args.executor == "sim" and not getattr(ns, "processes", False):
        raise ValueError("ranks on several nodes are processes: use --executor torch, or --executor sim --processes")
    if getattr(ns, "pace", None) is not None:
        raise ValueError("--pace applies to the in-process simulator only, not to ranks on several nodes")


def _advertised(master_addr: str, master_port: int) -> str:
    try:
        return route_address(master_addr, master_port)
    except OSError as exc:
        raise ValueError(f"cannot find a route to --master-addr {master_addr}: {exc}") from exc


def cluster_driver(
    args: ServerArgs, plan: NodePlan, ns: argparse.Namespace, run_id: str, **local_kwargs: Any
) -> ClusterDriver:
    """Node 0's driver: hosts (or joins) the rendezvous store, links every agent when started."""
    from control.plane.auth import TOKEN_ENV

    token = getattr(ns, "admin_token", None) or os.environ.get(TOKEN_ENV) or None
    return ClusterDriver(
        args,
        plan.layout,
        plan.directory(),
        init_method=plan.init_method,
        run_id=run_id,
        token=token,
        tls_ca=getattr(ns, "tls_cert", None),
        ready_timeout_s=plan.rendezvous_timeout_s,
        first_local_rank=plan.first_local_rank,
        log=lambda line: print(line, flush=True),
        vote_log_dir=getattr(ns, "vote_log_dir", None),
        **local_kwargs,
    )
