"""The hand-written OTLP encoder builds the very message the OpenTelemetry SDK's encoder builds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from control.telemetry.otlp_wire import (
    KIND_INTERNAL,
    KIND_SERVER,
    STATUS_ERROR,
    SpanData,
    encode_request,
    encode_span,
    producer,
    varint,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_KINDS = {KIND_INTERNAL: SpanKind.INTERNAL, KIND_SERVER: SpanKind.SERVER}

attribute_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.lists(st.text(max_size=8), min_size=1, max_size=3).map(tuple),
)
attribute_maps = st.dictionaries(st.text(min_size=1, max_size=12), attribute_values, max_size=6)
ids = st.integers(min_value=1, max_value=2**64 - 1)
spans = st.builds(
    SpanData,
    trace_id=st.integers(min_value=1, max_value=2**128 - 1),
    span_id=ids,
    parent_id=st.one_of(st.just(0), ids),
    name=st.text(min_size=1, max_size=16),
    kind=st.sampled_from([KIND_INTERNAL, KIND_SERVER]),
    start_ns=st.integers(min_value=0, max_value=2**63),
    end_ns=st.integers(min_value=0, max_value=2**63),
    attributes=attribute_maps,
    events=st.lists(st.tuples(st.text(max_size=8), st.integers(0, 2**63), attribute_maps), max_size=3),
    links=st.lists(st.tuples(st.integers(1, 2**128 - 1), ids, attribute_maps), max_size=3),
    status=st.one_of(st.none(), st.tuples(st.just(STATUS_ERROR), st.text(max_size=10))),
    parent_remote=st.booleans(),
)


def sdk_span(span: SpanData, resource: dict, scope: InstrumentationScope) -> ReadableSpan:
    """The same span as the SDK would hold it."""
    parent = SpanContext(span.trace_id, span.parent_id, span.parent_remote, _SAMPLED) if span.parent_id else None
    code, message = span.status or (0, "")
    return ReadableSpan(
        name=span.name,
        context=SpanContext(span.trace_id, span.span_id, False, _SAMPLED),
        parent=parent,
        resource=Resource(resource),
        attributes=dict(span.attributes),
        events=[Event(name, dict(attributes), time_ns) for name, time_ns, attributes in span.events],
        links=[Link(SpanContext(t, s, True, _SAMPLED), dict(a)) for t, s, a in span.links],
        kind=_KINDS[span.kind],
        status=Status(StatusCode.ERROR, message) if code else Status(StatusCode.UNSET),
        start_time=span.start_ns,
        end_time=max(span.start_ns, span.end_ns),
        instrumentation_scope=scope,
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(spans, min_size=1, max_size=4), attribute_maps)
def test_encoding_equals_the_sdk_encoder_field_for_field(batch: list[SpanData], resource: dict):
    # Any span the tracer can build decodes (with opentelemetry-proto) to what encode_spans produces.
    resource = {"service.name": "prefill-gate", **resource}
    scope = InstrumentationScope("prefill_gate.tracing", "1.2.3")
    ours = encode_request([(producer(resource, scope.name, scope.version or ""), [encode_span(s) for s in batch])])
    theirs = encode_spans([sdk_span(s, resource, scope) for s in batch])
    assert trace_service_pb2.ExportTraceServiceRequest.FromString(ours) == theirs


def test_reused_attribute_encodings_stay_correct_across_types():
    # The pair cache must tell True from 1 from 1.0 (equal and hashing alike in Python).
    scope = InstrumentationScope("s", "1")
    batch = [SpanData(1, i + 1, 0, "x", KIND_INTERNAL, 0, 1, {"v": value}) for i, value in enumerate((True, 1, 1.0))]
    ours = encode_request([(producer({}, "s", "1"), [encode_span(s) for s in batch])])
    assert trace_service_pb2.ExportTraceServiceRequest.FromString(ours) == encode_spans(
        [sdk_span(s, {}, scope) for s in batch]
    )


def test_varint_matches_protobuf_for_edge_values():
    for value, expected in ((0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02")):
        assert varint(value) == expected
    assert varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes, as protobuf encodes it


def test_unencodable_attributes_are_refused_with_the_reason():
    # Bad input: a value OTLP cannot carry, an int beyond int64.
    with pytest.raises(TypeError, match="dict"):
        encode_span(SpanData(1, 1, 0, "x", KIND_INTERNAL, 0, 1, {"bad": {"a": 1}}))  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="int64"):
        encode_span(SpanData(1, 1, 0, "x", KIND_INTERNAL, 0, 1, {"big": 2**63}))
