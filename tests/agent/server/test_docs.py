"""The client snippet of docs/AGENT.md runs as written against a real agent."""

from __future__ import annotations

import re

from agent.sim import SimNode
from tests.agent.server.conftest import serve
from tests.tools import ROOT


def test_the_client_snippet_runs() -> None:
    text = (ROOT / "docs" / "AGENT.md").read_text()
    client = text[text.index("## Client") :]
    snippet = re.search(r"```python\n(.*?)```", client, re.S).group(1)
    with serve(SimNode("default", seed=0)) as server:
        code = snippet.replace('"127.0.0.1:50051"', repr(server.address))
        scope: dict = {}
        exec(compile(code, "docs/AGENT.md", "exec"), scope)  # a fresh namespace: no imports given
    assert scope["held"].groups[scope["lc"]][0].l3_mask == 0b1111
    assert scope["lc"] in scope["snap"].groups
