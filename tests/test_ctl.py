"""`prefill-gate ctl` against a real server: output, exit codes, field violations, no tracebacks."""

from __future__ import annotations

import argparse
import asyncio
import io
import json

import pytest

from control.plane.auth import TOKEN_ENV
from control.plane.ctl import add_ctl_parser, ctl_main
from engine.drivers.procs import free_port
from tests.grpc_plane import TOKEN, serving
from tests.helpers import sim_args

ARGS = sim_args(prefill_attempt_interval=2, prefill_any_attempt_interval=6)


async def ctl(target: str, *argv: str) -> tuple[int, str, str]:
    """Parse `prefill-gate ctl --target TARGET ARGV` as the CLI would and run it off the loop."""
    parser = argparse.ArgumentParser(prog="prefill-gate")
    add_ctl_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["ctl", "--target", target, *argv])
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(ctl_main, ns, out, err)
    return code, out.getvalue(), err.getvalue()


async def test_config_set_disable_and_their_errors(monkeypatch):
    async with serving(ARGS) as served:
        target = served.plane.target
        launch = "epoch 0  gate on  A=2 K=6  policy gate  launch: startup flags, A=2 K=6\n"
        assert await ctl(target, "config") == (0, launch, "")
        code, out, err = await ctl(target, "--token", TOKEN, "set", "--attempt", "3", "--any", "9", "--validate-only")
        valid = "valid (nothing changed): epoch 0  gate on  A=3 K=9  policy gate  operator: A 2->3, K 6->9\n"
        assert (code, out) == (0, valid)
        code, out, _ = await ctl(target, "--token", TOKEN, "set", "--attempt", "3", "--any", "9")
        assert code == 0 and out.startswith("adopted by every rank after round ")
        assert out.endswith("epoch 1  gate on  A=3 K=9  policy gate  operator: A 2->3, K 6->9\n")
        code, out, err = await ctl(target, "--token", TOKEN, "set", "--attempt", "-1", "--any", "0")
        assert code == 1 and out == ""
        assert err.splitlines()[0].startswith("error: INVALID_ARGUMENT: ")
        assert err.splitlines()[1:] == [
            "  attempt_interval: must be an integer in [1, 4294967295], got -1",
            "  any_interval: must be an integer in [1, 4294967295], got 0",
        ]
        code, _, err = await ctl(
            target, "--token", TOKEN, "set", "--attempt", "2", "--any", "6", "--expected-epoch", "0"
        )
        assert code == 1 and err.startswith("error: FAILED_PRECONDITION: expected config epoch 0")
        code, _, err = await ctl(target, "set", "--attempt", "2", "--any", "6")
        assert code == 1 and err.startswith("error: UNAUTHENTICATED")
        monkeypatch.setenv(TOKEN_ENV, "not-it")
        code, _, err = await ctl(target, "disable")
        assert code == 1 and err.startswith("error: PERMISSION_DENIED")
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        code, out, _ = await ctl(target, "disable", "--expected-epoch", "1", "--reason", "quiet night")
        assert code == 0 and out.endswith("epoch 2  gate off  policy gate  by operator: quiet night\n")
        code, out, _ = await ctl(target, "config")
        assert out == "epoch 2  gate off  policy gate  by operator: quiet night\n"
        assert "Traceback" not in err


async def test_watch_submit_and_snapshot():
    async with serving(ARGS, pace=1.0) as served:
        target = served.plane.target
        code, out, _ = await ctl(target, "watch", "--count", "3")
        lines = out.splitlines()
        assert code == 0 and len(lines) == 3 and all(line.startswith("round ") for line in lines)
        assert "e0 A2 K6" in lines[0]
        code, out, _ = await ctl(target, "watch", "--count", "2", "--rank", "1")
        assert code == 0 and out.count("\n    rank  1: tok") == 2 and "rank  0" not in out
        code, out, _ = await ctl(
            target, "--token", TOKEN, "submit", "--prompt-len", "40", "--output-len", "3", "--rank", "1"
        )
        lines = out.splitlines()
        assert code == 0 and lines[0].endswith("on rank 1") and lines[0].startswith("accepted req-")
        assert lines[1].startswith("first token after ") and lines[-1].startswith("finished: length, 3 tokens")
        code, _, err = await ctl(target, "--token", TOKEN, "submit", "--prompt", "1,x")
        assert code == 1 and "--prompt must be comma-separated token ids" in err
        code, _, err = await ctl(target, "--token", TOKEN, "submit", "--prompt-len", "0")
        assert code == 1 and "INVALID_ARGUMENT" in err and "  prompt_len: must be >= 1" in err
        code, out, _ = await ctl(target, "snapshot", "--json")
        snapshot = json.loads(out)
        assert code == 0 and snapshot["run_id"] == served.controller.run_id and snapshot["state"] == "serving"
        assert snapshot["stats"]["requests_finished"] == "1" and snapshot["config"]["attempt_interval"] == 2
        code, out, _ = await ctl(target, "snapshot")
        assert code == 0 and out.startswith(f"run {served.controller.run_id}  2 ranks  executor sim  [serving]")
        assert "requests 1/1 finished" in out


@pytest.mark.parametrize("command", [["config"], ["watch"], ["snapshot", "--json"]])
async def test_an_unreachable_server_is_one_line_and_exit_1(command):
    code, out, err = await ctl(f"127.0.0.1:{free_port()}", "--timeout", "2", *command)
    assert code == 1 and out == "" and err.startswith("error: UNAVAILABLE") and "Traceback" not in err
