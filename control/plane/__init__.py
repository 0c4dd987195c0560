"""The gRPC control plane: services, fan-out hub, auth, conversion, recording and `ctl`."""
