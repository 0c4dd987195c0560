"""The ways ranks can run: in lockstep in one process, or one process per rank."""
