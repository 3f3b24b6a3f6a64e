"""The definition language's messages for the mistakes people make: each at its path, saying
what would have been right."""

import pytest

from runs.definitions.spec import DefinitionInvalid, definition_parse

PAY = {"name": "pay", "kind": "connector", "action": "payments.charge", "credential": "default"}
CREDENTIALS = {("model", "default"), ("payments", "default")}


def refused(spec: dict) -> dict[str, list[str]]:
    with pytest.raises(DefinitionInvalid) as raised:
        definition_parse("payer", {"model": {"name": "m"}, "instructions": "Pay.", **spec},
                         credentials=CREDENTIALS)
    return raised.value.fields


def test_a_misspelt_field_is_refused_naming_the_field_it_meant():
    assert "did you mean 'instructions'?" in refused({"instruction": "x"})["instruction"][0]
    assert "did you mean 'max_tokens'?" in refused({"model": {"name": "m", "max_token": 5}})[
        "model.max_token"][0]
    assert "did you mean 'approval'?" in refused({"tools": [{**PAY, "aproval": "always"}]})[
        "tools[0].aproval"][0]


def test_a_rule_on_an_argument_the_tool_does_not_declare_is_refused_with_the_ones_it_does():
    fields = refused({"tools": [{**PAY, "approval": {"argument": "amout", "above": 500}}]})
    [message] = fields["tools[0].approval.argument"]
    assert "'amout' is not one of the tool's parameters (amount, currency, customer, description)" in message
    assert "did you mean 'amount'?" in message
    nested = {"type": "object", "properties": {"invoice": {"type": "object", "properties": {
        "total": {"type": "number"}, "currency": {"type": "string"}}}}}
    tool = {"name": "check", "kind": "sandbox", "command": "true", "parameters": nested}
    assert "'invoice.totl' is not one" in refused({"tools": [{**tool, "approval": {
        "argument": "invoice.totl", "above": 5}}]})["tools[0].approval.argument"][0]
    assert "compares numbers, but the parameters declare 'invoice.currency' as string" in refused(
        {"tools": [{**tool, "approval": {"argument": "invoice.currency", "at_least": 5}}]})[
        "tools[0].approval.argument"][0]
    # a dotted path into declared properties, and parameters that declare none, are accepted
    for parameters, argument in ((nested, "invoice.total"), ({"type": "object"}, "anything")):
        definition_parse("payer", {"model": {"name": "m"}, "instructions": "Pay.", "tools": [
            {**tool, "parameters": parameters, "approval": {"argument": argument, "above": 5}}]},
            credentials=CREDENTIALS)


def test_a_version_stored_before_the_rule_check_still_reads_back_and_asks_a_person():
    stored = {"model": {"name": "m"}, "instructions": "Pay.",
              "tools": [{**PAY, "approval": {"argument": "amout", "above": 500}}]}
    definition = definition_parse("payer", stored)  # read back: credentials=None
    assert definition.tool("pay").approval.needed({"amount": 1})  # missing argument: a person
