"""``python -m pytest_budgetbench.embedded_server.serve [llama_cpp.server's flags]``:
llama-cpp-python's server, with tool calls' arguments handed to the chat template as objects.

llama-cpp-python passes an earlier call's ``arguments`` to the template as the JSON text the
chat API carries, so a template's ``arguments | tojson`` writes an escaped string
(``"arguments": "{\\"key\\": \\"R1\\"}"``), and a small model copies that style into calls
that no longer decode. vLLM, llama.cpp's own server and transformers' templates parse the
text into an object first (the form tool-use templates are written for); so does this
server, by the one function the embedded counter renders with too
(:func:`~pytest_budgetbench.messages.arguments_as_objects`), so counts stay exact.
"""

from __future__ import annotations

import runpy
from typing import Any

from pytest_budgetbench.messages import arguments_as_objects


def render_arguments_as_objects() -> None:
    """Make every Jinja2 chat formatter of this process render arguments as objects."""
    from llama_cpp import llama_chat_format

    formatter = llama_chat_format.Jinja2ChatFormatter
    render = formatter.__call__

    def call(self: Any, *, messages: Any, **kwargs: Any) -> Any:
        return render(self, messages=arguments_as_objects(messages),  # type: ignore[arg-type]
                      **kwargs)

    formatter.__call__ = call  # type: ignore[method-assign]


if __name__ == "__main__":
    render_arguments_as_objects()
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
