"""Prefill policies besides the gate: the local interval (L1) and the lab's public peers."""
