"""The .proto files are the contract; the generated code in prefill_gate/ must match them."""

from __future__ import annotations

from control import protogen


def test_generated_code_is_current():
    stale = protogen.stale_files()
    assert not stale, f"run `python -m control.protogen`; stale: {stale}"


def test_a_changed_proto_is_detected(tmp_path, monkeypatch):
    # Copy the protos, add a field, and point the generator at the copy: the committed code is now stale.
    source = protogen.PROTO_ROOT / protogen.PACKAGE
    copy = tmp_path / "protos" / protogen.PACKAGE
    copy.mkdir(parents=True)
    for proto in source.glob("*.proto"):
        (copy / proto.name).write_text(proto.read_text())
    types = copy / "types.proto"
    types.write_text(types.read_text().replace("message GateConfig {", "message GateConfig {\n  bool probe = 99;"))
    monkeypatch.setattr(protogen, "PROTO_ROOT", tmp_path / "protos")
    assert "prefill_gate/v1/types_pb2.py" in protogen.stale_files()
