"""The node agent: what `prefill-gate serve` runs on every node but node 0.

It spawns this node's ranks (they join the group through torch's rendezvous and wait for round 0),
serves the `NodeAgent.Link` service with the control plane's token and TLS options, publishes its
address in the rendezvous store and waits for node 0's controller to link. The agent exits 0 only
when node 0 ended the run cleanly after every rank of this node exited; anything else (a rank that
failed, node 0 abandoning the run, a lost link, Ctrl-C) kills its ranks and exits 1 with one line
naming what failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TextIO

import grpc

from control.host.nodes import NodePlan
from control.plane.auth import TOKEN_ENV, BearerTokenInterceptor
from engine.config import ServerArgs
from engine.drivers.agent import NodeAgentService, supervise
from engine.drivers.cluster import KEEPALIVE_OPTIONS, LINK_METHOD, dial_target
from engine.drivers.procs import ProcessDriver
from prefill_gate.v1 import nodes_pb2_grpc


def agent_main(ns: argparse.Namespace, args: ServerArgs, plan: NodePlan, out: TextIO = sys.stdout) -> int:
    """Run this node's agent until the run ends; returns the exit code."""
    driver = ProcessDriver(
        args,
        ranks=plan.layout.ranks,
        init_method=plan.init_method,
        max_rounds=getattr(ns, "rounds", None),
        first_local_rank=plan.first_local_rank,
        vote_log_dir=getattr(ns, "vote_log_dir", None),
    )
    # From the main thread, which lives as long as the agent: the ranks' parent-death signal is tied to it.
    driver.launch()
    try:
        return asyncio.run(_serve(ns, args, plan, driver, out))
    finally:
        driver.terminate()


async def _serve(ns: argparse.Namespace, args: ServerArgs, plan: NodePlan, driver: ProcessDriver, out: TextIO) -> int:
    layout = plan.layout
    name = layout.describe(layout.node)
    service = NodeAgentService(driver, layout, args)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, service.finish, f"stopped by {signal.Signals(sig).name}")
    token = getattr(ns, "admin_token", None) or os.environ.get(TOKEN_ENV) or None
    interceptors = [BearerTokenInterceptor(token, {LINK_METHOD})] if token else []
    server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0), *KEEPALIVE_OPTIONS])
    nodes_pb2_grpc.add_NodeAgentServicer_to_server(service, server)
    address = dial_target(plan.node_addr, plan.node_port)
    try:
        if ns.tls_cert:
            key_pair = (Path(ns.tls_key).read_bytes(), Path(ns.tls_cert).read_bytes())
            port = server.add_secure_port(address, grpc.ssl_server_credentials([key_pair]))
        else:
            port = server.add_insecure_port(address)
    except (RuntimeError, OSError) as exc:
        print(f"error: {name}: cannot bind its agent to {address}: {exc}", file=sys.stderr, flush=True)
        return 1
    await server.start()
    target = dial_target(plan.node_addr, port)
    try:
        directory = await asyncio.to_thread(plan.directory)
        await asyncio.to_thread(directory.publish, layout.node, target)
    except OSError as exc:
        await server.stop(0)
        print(f"error: {name}: {exc}", file=sys.stderr, flush=True)
        return 1
    pids = " ".join(str(p.pid) for p in driver.processes)
    scheme = "grpcs" if ns.tls_cert else "grpc"
    print(
        f"{name}: agent at {scheme}://{target}, rank pids {pids}; waiting for {layout.controller} "
        f"(rendezvous {plan.master_addr}:{plan.master_port})",
        file=out,
        flush=True,
    )
    watchdog = asyncio.create_task(supervise(service, plan.rendezvous_timeout_s))
    failure = await service.done
    watchdog.cancel()
    if service.linked:  # the link's last words reach node 0 before the ranks go
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(service.link_ended.wait(), 2.0)
    if failure is None:
        driver.join(10)  # every rank said goodbye before node 0 ended the link
    driver.terminate()
    await server.stop(1.0)
    if failure is not None:
        print(f"error: {name}: {failure}", file=sys.stderr, flush=True)
        return 1
    print(f"{name}: every rank exited; {layout.controller} ended the run", file=out, flush=True)
    return 0
