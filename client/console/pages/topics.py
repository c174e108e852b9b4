"""The console's topics page(s)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from rillet.client.console.context import ConsoleContext
from rillet.client.console.live import Fragments


def routes(ctx: ConsoleContext, fragments: Fragments) -> list[BaseRoute]:
    return []
