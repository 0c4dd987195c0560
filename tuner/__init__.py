"""The autotuner: moves the gate's intervals A and K live to a latency SLO (docs/autotune.md).

`estimates` (a sliding window of round records) and `law` (the control law) are pure; `core` guards the
law (dwell, rate cap, an operator's change, a new run); `loop` runs it against any control plane;
`client` is that plane over gRPC (`prefill-gate tune`).
"""
