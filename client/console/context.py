"""What every console page shares: its settings, the Admin client, the templates and the
cached cluster snapshot. One ``ConsoleContext`` per running console."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from rillet.client.admin import Admin
from rillet.client.console.forms import is_loopback
from rillet.client.console.snapshot import SnapshotCache

HERE = Path(__file__).parent
# The top navigation, in order: (path, label). Pages add nothing here themselves so the
# bar is the same on every page.
NAV = (
    ("/", "Overview"),
    ("/topics", "Topics"),
    ("/messages", "Messages"),
    ("/groups", "Consumer groups"),
)


def make_templates() -> Jinja2Templates:
    """Autoescaping always on: keys, values and topic names come from users and are
    shown as text, never as markup."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return Jinja2Templates(env=env)


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    bootstrap: str = "127.0.0.1:9092"
    host: str = "127.0.0.1"
    port: int = 8080
    read_only: bool = False
    # How often the background snapshot is taken; list pages and live updates use it.
    refresh_s: float = 2.0
    # How long the charts' history reaches back (samples are kept per refresh).
    history_s: float = 600.0
    # How often log sizes and offsets are sampled (DescribeLogDirs to every leader);
    # None: every max(5 s, refresh_s).
    logs_s: float | None = None
    # Broker id -> its Prometheus /metrics URL, for bytes out (optional; metrics.py).
    metrics: Mapping[int, str] = field(default_factory=dict)
    # Answer only loopback Host names even when bound wider: a console in a container
    # binds 0.0.0.0 there but is published on the host's loopback (hostguard.py).
    loopback_names_only: bool = False

    @property
    def loopback_names(self) -> bool:
        """Whether only loopback Host names are answered (hostguard.py)."""
        return self.loopback_names_only or is_loopback(self.host)


class Service(Protocol):
    """Something a page runs in the background (a cache, a shared client): started
    after the first snapshot, stopped before the Admin closes."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(slots=True)
class ConsoleContext:
    config: ConsoleConfig
    admin: Admin
    snapshots: SnapshotCache
    templates: Jinja2Templates = field(default_factory=lambda: make_templates())
    services: list[Service] = field(default_factory=list)

    def render(
        self, request: Request, template: str, status_code: int = 200, **values: Any
    ) -> HTMLResponse:
        """A page or fragment with what every template may use: the nav, the read-only
        flag, the bootstrap string and the latest snapshot."""
        values.setdefault("snapshot", self.snapshots.latest)
        return self.templates.TemplateResponse(
            request,
            template,
            {
                # Actions exist only when the console may change the cluster.
                "nav": NAV if self.config.read_only else (*NAV, ("/actions", "Actions")),
                "read_only": self.config.read_only,
                "bootstrap": self.config.bootstrap,
                "snapshot_error": self.snapshots.error,
                **values,
            },
            status_code=status_code,
        )
