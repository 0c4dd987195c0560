"""The contract explains itself: every service, rpc, message, enum, enum value and field in protos/ has a
comment, either on the lines right above it or at the end of its own line."""

from __future__ import annotations

import re
from pathlib import Path

PROTOS = Path(__file__).resolve().parent.parent / "protos"

ELEMENT = re.compile(
    r"^\s*(?:"
    r"(?P<block>service|message|enum|oneof)\s+(?P<name>\w+)\s*\{"
    r"|rpc\s+(?P<rpc>\w+)\s*\("
    r"|(?:(?:optional|repeated)\s+)?(?:map<[^>]+>|[\w.]+)\s+(?P<field>\w+)\s*=\s*\d+"
    r"|(?P<value>[A-Z][A-Z0-9_]*)\s*=\s*-?\d+"
    r")"
)


def uncommented(text: str) -> list[str]:
    """'line: element' for every element without a comment."""
    missing = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        code = line.split("//", 1)[0]
        if code.strip().startswith(("syntax", "package", "import", "option", "reserved")):
            continue
        match = ELEMENT.match(code)
        if match is None:
            continue
        name = next(group for group in match.groups()[1:] if group)
        previous = lines[number - 2].strip() if number > 1 else ""
        if "//" not in line and not previous.startswith("//"):
            missing.append(f"{number}: {name}")
    return missing


def test_every_element_of_the_contract_has_a_comment():
    files = sorted(PROTOS.rglob("*.proto"))
    assert files
    missing = {str(path.relative_to(PROTOS)): uncommented(path.read_text()) for path in files}
    assert {path: names for path, names in missing.items() if names} == {}


def test_the_check_finds_what_is_missing():
    text = "\n".join(
        [
            "// A documented message.",
            "message Documented {",
            "  uint64 round = 1;  // explained",
            "  repeated RankRow ranks = 2;",
            "  map<string, int64> counts = 3;",
            "}",
            "message Bare {}",
            "enum Mode {",
            "  // explained above",
            "  MODE_A = 0;",
            "  MODE_B = 1;",
            "}",
            "service Plane {",
            "  rpc Watch(Request) returns (stream Record);",
            "}",
        ]
    )
    assert uncommented(text) == [
        "4: ranks", "5: counts", "7: Bare", "8: Mode", "11: MODE_B", "13: Plane", "14: Watch"
    ]  # fmt: skip
