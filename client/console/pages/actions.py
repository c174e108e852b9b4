"""Actions: create and delete a topic, change a topic config, preferred leader
election, reset a group's offsets. Absent with ``--read-only``: no route is registered
and no page links to one.

Every action goes form → confirmation → execute. The confirmation says exactly what
will happen (for an offset reset: the dry-run plan, per partition) and shows the
``rillet`` command that does the same, so what the console does can be repeated or
scripted from a shell. Both steps are POSTs behind the same-origin guard (forms.py);
the execute step replays the confirmed fields, and a reset plans again as the CLI's
``--execute`` does, so a group that gained members since is still refused.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from rillet.client.admin import Admin, NewTopic
from rillet.client.cli.common import parse_configs
from rillet.client.cli.group import (
    DATETIME,
    EARLIEST,
    LATEST,
    OFFSET,
    SHIFT,
    ResetMode,
    ResetRow,
    TopicSpec,
    parse_datetime,
    parse_topic,
    plan_group_reset,
)
from rillet.client.cli.leader import summarize_election
from rillet.client.console.context import ConsoleContext
from rillet.client.console.forms import CLUSTER_ERRORS, command, error_text, same_origin
from rillet.client.console.live import Fragments

RESET_MODES = (EARLIEST, LATEST, OFFSET, DATETIME, SHIFT)


@dataclass(slots=True)
class Plan:
    """A confirmation: what will happen, the CLI command, the fields to replay."""

    summary: list[str]
    cli: str
    fields: dict[str, str]
    table: tuple[tuple[str, ...], list[tuple[Any, ...]]] | None = None
    danger: bool = False


@dataclass(slots=True)
class Outcome:
    lines: list[str]
    table: tuple[tuple[str, ...], list[tuple[Any, ...]]] | None = None
    ok: bool = True
    links: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    title: str
    plan: Callable[[Admin, str, FormData], Awaitable[Plan]]
    run: Callable[[Admin, FormData], Awaitable[Outcome]]
    # What the form shows besides its fields (e.g. a topic's configs), from its query.
    context: Callable[[Admin, dict[str, str]], Awaitable[dict[str, Any]]] | None = None


def text(form: FormData, name: str) -> str:
    return str(form.get(name, "")).strip()


def required(form: FormData, name: str, what: str) -> str:
    value = text(form, name)
    if not value:
        raise ValueError(f"say which {what}")
    return value


def number(form: FormData, name: str, default: int = -1) -> int:
    value = text(form, name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        what = name.replace("_", " ")
        raise ValueError(f"{what} must be a whole number, not {value!r}") from None


# --- create topic ----------------------------------------------------------------------


def _new_topic(form: FormData) -> NewTopic:
    configs = parse_configs([line for line in text(form, "configs").splitlines() if line.strip()])
    return NewTopic(
        required(form, "topic", "topic"),
        number(form, "partitions"),
        number(form, "replication_factor"),
        configs,
    )


async def plan_create(admin: Admin, bootstrap: str, form: FormData) -> Plan:
    t = _new_topic(form)
    await admin.create_topics([t], validate_only=True)  # the controller's own checks
    words: list[str | int] = ["rillet", "topic", "create", t.name]
    if t.num_partitions >= 0:
        words += ["--partitions", t.num_partitions]
    if t.replication_factor >= 0:
        words += ["--replication-factor", t.replication_factor]
    for k, v in t.configs.items():
        words += ["--config", f"{k}={v}"]
    parts = t.num_partitions if t.num_partitions >= 0 else "the broker's default number of"
    rf = t.replication_factor if t.replication_factor >= 0 else "the default"
    summary = [f"Create topic {t.name} with {parts} partitions, replication factor {rf}."]
    summary += [f"Set {k} = {v}." for k, v in t.configs.items()]
    return Plan(summary, command(*words, "--bootstrap", bootstrap), _fields(form))


async def run_create(admin: Admin, form: FormData) -> Outcome:
    t = _new_topic(form)
    await admin.create_topics([t])
    return Outcome([f"Created topic {t.name}."], links=[(f"/topics/{t.name}", "see the topic")])


# --- delete topic ----------------------------------------------------------------------


async def plan_delete(admin: Admin, bootstrap: str, form: FormData) -> Plan:
    name = required(form, "topic", "topic")
    (t,) = await admin.describe_topics([name])
    summary = [
        f"Delete topic {name} and its {len(t.partitions)} partitions with every record in "
        "them. This cannot be undone."
    ]
    cli = command("rillet", "topic", "delete", name, "--bootstrap", bootstrap)
    return Plan(summary, cli, {"topic": name}, danger=True)


async def run_delete(admin: Admin, form: FormData) -> Outcome:
    name = required(form, "topic", "topic")
    await admin.delete_topics([name])
    return Outcome([f"Deleted topic {name}."])


# --- change a topic config -------------------------------------------------------------


def _config_change(form: FormData) -> tuple[str, str, str | None]:
    topic = required(form, "topic", "topic")
    key = required(form, "key", "config")
    if text(form, "op") == "delete":
        return topic, key, None
    return topic, key, str(form.get("value", ""))


async def plan_config(admin: Admin, bootstrap: str, form: FormData) -> Plan:
    topic, key, value = _config_change(form)
    await admin.incremental_alter_configs({topic: {key: value}}, validate_only=True)
    now = (await admin.describe_configs([topic], keys=[key]))[topic].get(key)
    was = "unset" if now is None else f"{now.value}{' (default)' if now.is_default else ''}"
    if value is None:
        summary = [f"Remove {key} from topic {topic} (now {was}): it goes back to the default."]
        words = ["--delete", key]
    else:
        summary = [f"Set {key} = {value} on topic {topic} (now {was})."]
        words = ["--set", f"{key}={value}"]
    cli = command("rillet", "topic", "alter", topic, *words, "--bootstrap", bootstrap)
    return Plan(summary, cli, _fields(form))


async def config_context(admin: Admin, values: dict[str, str]) -> dict[str, Any]:
    """The topic's configs, the ones set on it first, for the form to show."""
    topic = values.get("topic", "")
    if not topic:
        return {}
    entries = (await admin.describe_configs([topic]))[topic].values()
    return {"configs": sorted(entries, key=lambda e: (e.is_default, e.name))}


async def run_config(admin: Admin, form: FormData) -> Outcome:
    topic, key, value = _config_change(form)
    await admin.incremental_alter_configs({topic: {key: value}})
    done = f"Removed {key} from" if value is None else f"Set {key} = {value} on"
    return Outcome([f"{done} topic {topic}."], links=[(f"/topics/{topic}", "see the topic")])


# --- preferred leader election ---------------------------------------------------------


async def plan_elect(admin: Admin, bootstrap: str, form: FormData) -> Plan:
    topic = text(form, "topic")
    if topic:
        await admin.describe_topics([topic])  # an unknown topic fails here, readably
    where = f"every partition of topic {topic}" if topic else "every partition of every topic"
    summary = [
        f"Move the leadership of {where} that is not led by its preferred replica (its "
        "first replica) back to it, where that replica is alive and in the ISR."
    ]
    words = ["rillet", "leader", "elect", "--preferred", *([topic] if topic else [])]
    return Plan(summary, command(*words, "--bootstrap", bootstrap), {"topic": topic})


async def run_elect(admin: Admin, form: FormData) -> Outcome:
    topic = text(form, "topic")
    summary = summarize_election(await admin.elect_leaders([topic] if topic else None))
    lines = [
        f"Elected the preferred leader of {len(summary['elected'])} partition(s).",
        f"{len(summary['not_needed'])} partition(s) were already led by it.",
    ]
    rows = [(f["topic"], f["partition"], f["error"], f["message"]) for f in summary["failed"]]
    table = (("topic", "partition", "error", "message"), rows[:500]) if rows else None
    return Outcome(lines, table, ok=not rows)


# --- reset group offsets ---------------------------------------------------------------


def _reset_args(form: FormData) -> tuple[str, list[TopicSpec] | None, ResetMode]:
    group = required(form, "group", "group")
    topics_text = text(form, "topics")
    try:
        topics = [parse_topic(t) for t in topics_text.split()] if topics_text else None
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    kind = text(form, "mode")
    if kind not in RESET_MODES:
        raise ValueError("choose where to reset to")
    value = 0
    if kind in (OFFSET, SHIFT):
        if not text(form, "value"):
            raise ValueError(f"--{kind} needs a number")
        value = number(form, "value")
    elif kind == DATETIME:
        try:
            value = parse_datetime(required(form, "value", "time"))
        except argparse.ArgumentTypeError as e:
            raise ValueError(str(e)) from None
    return group, topics, ResetMode(kind, value)


def reset_command(bootstrap: str, form: FormData) -> str:
    group, topics, mode = _reset_args(form)
    words: list[str | int] = ["rillet", "group", "reset-offsets", group]
    if topics is None:
        words.append("--all-topics")
    for name, parts in topics or ():
        words += ["--topic", name if parts is None else f"{name}:{','.join(map(str, parts))}"]
    if mode.kind in (OFFSET, SHIFT):
        words.append(f"--{mode.kind}={mode.value}")  # "=": a negative shift is no option
    elif mode.kind == DATETIME:
        words += [f"--{mode.kind}", text(form, "value")]
    else:
        words.append(f"--{mode.kind}")
    return command(*words, "--execute", "--bootstrap", bootstrap)


def _reset_table(rows: list[ResetRow]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    headers = ("topic", "partition", "current offset", "new offset", "log start", "log end")
    return headers, [
        (
            r.topic,
            r.partition,
            "-" if r.current_offset is None else r.current_offset,
            r.new_offset,
            r.log_start_offset,
            r.log_end_offset,
        )
        for r in rows
    ]


async def plan_reset(admin: Admin, bootstrap: str, form: FormData) -> Plan:
    group, topics, mode = _reset_args(form)
    rows = await plan_group_reset(admin, group, topics, mode)
    summary = [
        f"Write these committed offsets for group {group} ({len(rows)} partition(s)); its "
        "consumers start from them when they join. Offsets outside a log are clamped to it."
    ]
    return Plan(summary, reset_command(bootstrap, form), _fields(form), _reset_table(rows))


async def run_reset(admin: Admin, form: FormData) -> Outcome:
    group, topics, mode = _reset_args(form)
    rows = await plan_group_reset(admin, group, topics, mode)
    await admin.alter_group_offsets(group, {(r.topic, r.partition): r.new_offset for r in rows})
    return Outcome(
        [f"Wrote the new offsets of group {group}."],
        _reset_table(rows),
        links=[(f"/groups/{group}", "see the group")],
    )


ACTIONS = {
    a.name: a
    for a in (
        Action("create-topic", "Create a topic", plan_create, run_create),
        Action("delete-topic", "Delete a topic", plan_delete, run_delete),
        Action("alter-config", "Change a topic config", plan_config, run_config, config_context),
        Action("elect-leaders", "Preferred leader election", plan_elect, run_elect),
        Action("reset-offsets", "Reset a group's offsets", plan_reset, run_reset),
    )
}


def _fields(form: FormData) -> dict[str, str]:
    return {k: str(v) for k, v in form.items() if k != "step"}


def routes(ctx: ConsoleContext, fragments: Fragments) -> list[BaseRoute]:
    if ctx.config.read_only:
        return []
    bootstrap = ctx.config.bootstrap

    async def index(request: Request) -> Response:
        return ctx.render(request, "actions/index.html", actions=ACTIONS.values())

    async def topic_actions(request: Request) -> Response:
        return ctx.render(
            request, "actions/topic.html", topic=request.query_params.get("topic", "")
        )

    async def form(
        request: Request, action: Action, values: dict[str, str], error: str, status: int = 200
    ) -> Response:
        extra: dict[str, Any] = {}
        if action.context is not None:
            try:
                extra = await action.context(ctx.admin, values)
            except CLUSTER_ERRORS as e:
                error = error or error_text(e)
        return ctx.render(
            request,
            f"actions/{action.name}.html",
            status_code=status,
            action=action,
            values=values,
            error=error,
            modes=RESET_MODES,
            **extra,
        )

    async def form_page(request: Request) -> Response:
        action = ACTIONS.get(request.path_params["name"])
        if action is None:
            return PlainTextResponse("no such action", status_code=404)
        return await form(request, action, dict(request.query_params), "")

    async def post(request: Request) -> Response:
        action = ACTIONS.get(request.path_params["name"])
        if action is None:
            return PlainTextResponse("no such action", status_code=404)
        if not same_origin(request, ctx.config.loopback_names):
            return PlainTextResponse("cross-site POST refused", status_code=403)
        fields = await request.form()
        if fields.get("step") == "execute":
            try:
                outcome = await action.run(ctx.admin, fields)
            except CLUSTER_ERRORS as e:
                outcome = Outcome([f"Failed: {error_text(e)}"], ok=False)
            return ctx.render(request, "actions/result.html", action=action, outcome=outcome)
        try:
            plan = await action.plan(ctx.admin, bootstrap, fields)
        except CLUSTER_ERRORS as e:
            return await form(request, action, _fields(fields), error_text(e), 400)
        return ctx.render(request, "actions/confirm.html", action=action, plan=plan)

    return [
        Route("/actions", index, name="actions"),
        Route("/actions/topic", topic_actions),
        Route("/actions/{name}", form_page, methods=["GET"]),
        Route("/actions/{name}", post, methods=["POST"]),
    ]
