"""Hosting the engine: the controller, its backends, `serve` and the demo."""
