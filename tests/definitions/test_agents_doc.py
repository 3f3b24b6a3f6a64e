"""docs/agents.md's complete example is the definition `make run` stores
(deploy/demo/invoice-triage.json), and the definition language accepts it as printed."""

import json
import re
from pathlib import Path

from runs.definitions.spec import definition_parse

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_documented_example_is_the_demo_definition_and_it_parses():
    doc = (ROOT / "docs" / "agents.md").read_text()
    block = re.search(r"## A complete example.*?```json\n(.*?)\n```", doc, re.S).group(1)
    shown = json.loads(block)
    assert shown == json.loads((ROOT / "deploy" / "demo" / "invoice-triage.json").read_text())
    command = re.search(r"unfolded.*?```python\n(.*?)```", doc, re.S).group(1)
    assert command == shown["tools"][0]["command"]
    definition = definition_parse("invoice-triage", shown,
                                  credentials={("model", "demo"), ("payments", "demo"), ("email", "default")})
    pay = definition.tool("pay_invoice")
    assert pay.approval.needed({"amount": 50001}) and not pay.approval.needed({"amount": 50000})
