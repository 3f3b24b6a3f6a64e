"""The scripted model server (integrations/scripted_model.py) as a test fixture: served from a
thread of the test process on a free port, with the script the test gives.

    def test_x(scripted_model):
        scripted_model.script({"helper": [{"content": "hi"}]})
        ... scripted_model.state()["by_turn"]

Workers in other processes reach it by its URL like any provider (`model_credential_set`
points the tenant's model credential at it).
"""

from typing import Any

from integrations.scripted_model import ScriptedModelServer


class ScriptedModelFixture:
    def __init__(self, server: ScriptedModelServer):
        self.server = server
        self.url = server.url
        self.base_url = server.url + "/v1"

    def script(self, scripts: dict[str, list[dict]]) -> None:
        """Replace every script: {"<model name>": [<turn>, ...]}."""
        self.server.model.script_set({"scripts": scripts})

    def state(self) -> dict[str, Any]:
        return self.server.model.state()

    def requests(self, model: str | None = None) -> int:
        state = self.state()
        return state["requests"] if model is None else state["by_model"].get(model, 0)

    def reset(self) -> None:
        self.server.model.reset()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
