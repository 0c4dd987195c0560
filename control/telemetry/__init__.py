"""Telemetry: OpenTelemetry round and request spans, OTLP export, metrics."""
