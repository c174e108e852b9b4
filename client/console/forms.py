"""What the console's forms and actions share: the same-origin guard on every POST, the
readable text of a cluster error, query-string links, and a command line shown as the
CLI command an action equals.

There is no login (the console binds 127.0.0.1 by default), so the guard is what stops
another site open in the same browser from posting to the console: a browser always
sends ``Origin`` (or at least ``Referer``) with a cross-site POST, and it must name the
console's own host and port (and, for a loopback console, a loopback name).
"""

from __future__ import annotations

import asyncio
import ipaddress
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request

from rillet.client.admin import AdminError
from rillet.client.cli.common import CliError
from rillet.client.producer import DeliveryError
from rillet.client.wire.errors import RilletError

# What a cluster call may raise that a page shows as a message instead of a 500.
CLUSTER_ERRORS = (
    AdminError,
    RilletError,
    CliError,
    DeliveryError,
    OSError,
    asyncio.TimeoutError,
    ValueError,
)


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    try:
        return host in LOOPBACK_NAMES or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8080`` gives ``::1``)."""
    try:
        return urlsplit(f"//{host_header}").hostname or ""
    except ValueError:  # a malformed bracket
        return ""


def same_origin(request: Request, loopback_names: bool = True) -> bool:
    """True when the POST comes from a page the console served itself. A console that
    answers only loopback names (bound to loopback, or told so) also wants one in
    ``Host``: a page whose own name was made to resolve to 127.0.0.1 (DNS rebinding)
    sends a matching Origin too."""
    host = request.headers.get("host", "")
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or not host or urlsplit(source).netloc != host:
        return False
    return not loopback_names or is_loopback(host_name(host))


def error_text(e: BaseException) -> str:
    """One readable line: the error's name when it has one, and what it says."""
    if isinstance(e, RilletError):
        return f"{e.name}: {e}"
    if isinstance(e, asyncio.TimeoutError):
        return "the cluster did not answer in time"
    return str(e) or type(e).__name__


def link(path: str, params: Mapping[str, Any], **changes: Any) -> str:
    """``path`` with ``params`` and ``changes`` as its query (None drops a key)."""
    merged = {**params, **changes}
    query = urlencode({k: v for k, v in merged.items() if v is not None and v != ""})
    return f"{path}?{query}" if query else path


def command(*words: str | int) -> str:
    """A shell-safe command line (values with spaces or quotes are quoted)."""
    return " ".join(shlex.quote(str(w)) for w in words)


def int_param(value: str | None, default: int, lo: int, hi: int) -> int:
    """A query or form integer, clamped; the default when absent or not a number."""
    try:
        n = int(value) if value not in (None, "") else default
    except ValueError:
        n = default
    return max(lo, min(hi, n))


PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Paged:
    """One page of a list already filtered and sorted on the server."""

    items: list[Any]
    page: int  # from 1
    pages: int
    total: int


def paginate(items: Sequence[Any], page: int, size: int = PAGE_SIZE) -> Paged:
    pages = max(1, -(-len(items) // size))
    page = max(1, min(page, pages))
    return Paged(list(items[(page - 1) * size : page * size]), page, pages, len(items))
