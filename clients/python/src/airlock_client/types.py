"""The daemon's answers as typed, immutable records.

Every class mirrors one object of the daemon's contract
(``supervisor/src/daemon/protocol.schema.json``) field for field, with the schema's names;
the test suite checks that they do not drift apart. Fields the schema allows to be null,
or leaves out, are ``X | None`` here. Reading is lenient about fields the daemon adds
later (they are ignored) and strict about the ones it must send: an answer lacking one
raises :class:`~airlock_client.errors.ProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from .errors import ProtocolError

ErrorKind = Literal[
    "invalid_input",
    "unknown_tool",
    "tool_unavailable",
    "denied",
    "approval_required",
    "approval_invalid",
    "timeout",
    "out_of_memory",
    "pids_limit",
    "cpu_time_limit",
    "file_size_limit",
    "seccomp_violation",
    "tool_failed",
    "output_invalid",
    "protocol_violation",
    "sandbox_unavailable",
    "cancelled",
    "overloaded",
    "rate_limited",
    "workspace_full",
    "session_unknown",
    "session_limit",
]
"""Why a call did not succeed (``error.kind`` of a result record)."""

ToolState = Literal["active", "deferred", "suspended"]
UnavailableState = Literal["deferred", "suspended"]
SideEffect = Literal["read", "write", "destructive"]
ApprovalMode = Literal["auto", "human"]
Decision = Literal["allow", "deny", "review"]
Backend = Literal["airlock", "unsafe_local"]
LandlockLevel = Literal["full", "partial", "none"]
CgroupVersion = Literal["v1", "v2"]
NetworkEventKind = Literal["unknown", "connect", "forward", "socks5"]
NetworkEventEnd = Literal[
    "closed", "client_error", "upstream_error", "byte_limit", "stopped", "unreachable"
]
DenialLayer = Literal["seccomp", "landlock", "mounts", "network", "limit"]
Coverage = Literal["reported", "unavailable"]
SessionIsolation = Literal["overlay", "copy", "empty"]
ChangeKind = Literal["added", "modified", "deleted"]


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"the daemon's {what} is not a JSON object: {value!r:.200}")
    return cast(dict[str, Any], value)


def _field(obj: dict[str, Any], key: str, what: str) -> Any:
    try:
        return obj[key]
    except KeyError:
        raise ProtocolError(f"the daemon's {what} lacks the field {key!r}") from None


@dataclass(frozen=True, slots=True)
class Violation:
    """One way the arguments fail the tool's input schema (never the value itself)."""

    path: str
    keyword: str
    message: str

    @classmethod
    def from_json(cls, value: Any) -> Violation:
        o = _object(value, "violation")
        w = "violation"
        return cls(_field(o, "path", w), _field(o, "keyword", w), _field(o, "message", w))


@dataclass(frozen=True, slots=True)
class ToolError:
    """Why a call failed: ``kind``, ``message`` and the fields of that kind."""

    kind: ErrorKind
    message: str
    violations: tuple[Violation, ...] | None = None
    """invalid_input: JSON pointer and keyword of each violation."""
    syscall: str | None = None
    """seccomp_violation: the refused system call."""
    step: str | None = None
    """sandbox_unavailable: the set-up step that failed."""
    timeout_ms: int | None = None
    """timeout: the deadline that passed."""
    rule: str | None = None
    """denied, approval_required: the rule that decided."""
    retry_after_ms: int | None = None
    """overloaded: how long to wait before trying again."""
    state: UnavailableState | None = None
    """tool_unavailable: the tool's state."""

    @classmethod
    def from_json(cls, value: Any) -> ToolError:
        o = _object(value, "error")
        violations = o.get("violations")
        return cls(
            kind=_field(o, "kind", "error"),
            message=_field(o, "message", "error"),
            violations=(
                None if violations is None else tuple(Violation.from_json(v) for v in violations)
            ),
            syscall=o.get("syscall"),
            step=o.get("step"),
            timeout_ms=o.get("timeout_ms"),
            rule=o.get("rule"),
            retry_after_ms=o.get("retry_after_ms"),
            state=o.get("state"),
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """What the call's processes used."""

    cpu_ms: int
    peak_memory_bytes: int | None

    @classmethod
    def from_json(cls, value: Any) -> Usage:
        o = _object(value, "usage")
        return cls(_field(o, "cpu_ms", "usage"), _field(o, "peak_memory_bytes", "usage"))


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits the call ran under."""

    memory_bytes: int
    pids: int
    timeout_ms: int
    output_bytes: int

    @classmethod
    def from_json(cls, value: Any) -> Limits:
        o = _object(value, "limits")
        w = "limits"
        return cls(
            _field(o, "memory_bytes", w),
            _field(o, "pids", w),
            _field(o, "timeout_ms", w),
            _field(o, "output_bytes", w),
        )


@dataclass(frozen=True, slots=True)
class DenialReporting:
    """Per layer, whether the call's ``denials`` can show its refusals (``unavailable``: an
    empty list says nothing of that layer)."""

    seccomp: Coverage
    landlock: Coverage
    mounts: Coverage
    network: Coverage
    limits: Coverage

    @classmethod
    def from_json(cls, value: Any) -> DenialReporting:
        o = _object(value, "denial_reporting")
        w = "denial_reporting"
        return cls(
            seccomp=_field(o, "seccomp", w),
            landlock=_field(o, "landlock", w),
            mounts=_field(o, "mounts", w),
            network=_field(o, "network", w),
            limits=_field(o, "limits", w),
        )


@dataclass(frozen=True, slots=True)
class Denial:
    """One kind of refusal during a call, counted: which layer refused what."""

    layer: DenialLayer
    object: str
    """A syscall's name, a destination ``host:port`` or a limit's name."""
    count: int
    errno: str | None = None
    """seccomp: the errno the syscall got."""
    rule: str | None = None
    """seccomp: the argument rule; network: the reason; limit ``output``: the stream."""

    @classmethod
    def from_json(cls, value: Any) -> Denial:
        o = _object(value, "denial")
        w = "denial"
        return cls(
            layer=_field(o, "layer", w),
            object=_field(o, "object", w),
            count=_field(o, "count", w),
            errno=o.get("errno"),
            rule=o.get("rule"),
        )


@dataclass(frozen=True, slots=True)
class Isolation:
    """How the call's worker was confined."""

    backend: Backend
    namespaces: tuple[str, ...]
    landlock_abi: int
    landlock: LandlockLevel
    seccomp: str | None
    cgroup: CgroupVersion | None
    limits: Limits
    denial_reporting: DenialReporting
    workspace: SessionIsolation | None
    """For a call in a session: how its workspace holds the session's base."""

    @classmethod
    def from_json(cls, value: Any) -> Isolation:
        o = _object(value, "isolation")
        w = "isolation"
        return cls(
            backend=_field(o, "backend", w),
            namespaces=tuple(_field(o, "namespaces", w)),
            landlock_abi=_field(o, "landlock_abi", w),
            landlock=_field(o, "landlock", w),
            seccomp=_field(o, "seccomp", w),
            cgroup=_field(o, "cgroup", w),
            limits=Limits.from_json(_field(o, "limits", w)),
            denial_reporting=DenialReporting.from_json(_field(o, "denial_reporting", w)),
            workspace=o.get("workspace"),
        )


@dataclass(frozen=True, slots=True)
class NetworkEvent:
    """One connection the egress proxy saw."""

    kind: NetworkEventKind
    host: str
    port: int
    address: str | None
    allowed: bool
    rule_or_reason: str
    bytes_up: int
    bytes_down: int
    end: NetworkEventEnd | None
    error: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> NetworkEvent:
        o = _object(value, "network event")
        w = "network event"
        return cls(
            kind=_field(o, "kind", w),
            host=_field(o, "host", w),
            port=_field(o, "port", w),
            address=_field(o, "address", w),
            allowed=_field(o, "allowed", w),
            rule_or_reason=_field(o, "rule_or_reason", w),
            bytes_up=_field(o, "bytes_up", w),
            bytes_down=_field(o, "bytes_down", w),
            end=_field(o, "end", w),
            error=o.get("error"),
        )


@dataclass(frozen=True, slots=True)
class Network:
    """What the egress proxy let through and refused (a profile with an allowlist)."""

    connections: int
    refused: int
    failed: int
    bytes_up: int
    bytes_down: int
    events: tuple[NetworkEvent, ...]
    events_omitted: int

    @classmethod
    def from_json(cls, value: Any) -> Network:
        o = _object(value, "network")
        w = "network"
        return cls(
            connections=_field(o, "connections", w),
            refused=_field(o, "refused", w),
            failed=_field(o, "failed", w),
            bytes_up=_field(o, "bytes_up", w),
            bytes_down=_field(o, "bytes_down", w),
            events=tuple(NetworkEvent.from_json(e) for e in _field(o, "events", w)),
            events_omitted=_field(o, "events_omitted", w),
        )


@dataclass(frozen=True, slots=True)
class CallResult:
    """One call's outcome, whatever happened: the daemon's result record.

    ``ok`` is true only for a call that ran and succeeded; otherwise ``error`` says why.
    ``output`` is the parsed JSON of a tool with an output schema (``stdout`` is then
    empty); for every other tool it is None and the output is ``stdout``.
    """

    call_id: str
    tool: str
    ok: bool
    output: Any
    error: ToolError | None
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    attempts: int
    usage: Usage
    isolation: Isolation | None
    """None for a call that never got a worker."""
    network: Network | None
    """None unless the tool's profile has an egress allowlist."""
    denials: tuple[Denial, ...]
    """What was refused during the call, by layer (see ``isolation.denial_reporting``)."""

    @classmethod
    def from_json(cls, value: Any) -> CallResult:
        o = _object(value, "result record")
        w = "result record"
        error = _field(o, "error", w)
        isolation = _field(o, "isolation", w)
        network = _field(o, "network", w)
        return cls(
            call_id=_field(o, "call_id", w),
            tool=_field(o, "tool", w),
            ok=_field(o, "ok", w),
            output=_field(o, "output", w),
            error=None if error is None else ToolError.from_json(error),
            exit_code=_field(o, "exit_code", w),
            signal=_field(o, "signal", w),
            stdout=_field(o, "stdout", w),
            stderr=_field(o, "stderr", w),
            stdout_truncated=_field(o, "stdout_truncated", w),
            stderr_truncated=_field(o, "stderr_truncated", w),
            duration_ms=_field(o, "duration_ms", w),
            attempts=_field(o, "attempts", w),
            usage=Usage.from_json(_field(o, "usage", w)),
            isolation=None if isolation is None else Isolation.from_json(isolation),
            network=None if network is None else Network.from_json(network),
            denials=tuple(Denial.from_json(d) for d in _field(o, "denials", w)),
        )


@dataclass(frozen=True, slots=True)
class ToolListing:
    """One tool of the policy, whatever its state: offer a model the ``active`` ones."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    side_effect: SideEffect
    category: str | None
    concurrency_safe: bool
    approval: ApprovalMode
    timeout_ms: int
    retries: int
    state: ToolState

    @classmethod
    def from_json(cls, value: Any) -> ToolListing:
        o = _object(value, "tool listing")
        w = "tool listing"
        return cls(
            name=_field(o, "name", w),
            description=_field(o, "description", w),
            input_schema=_field(o, "input_schema", w),
            output_schema=_field(o, "output_schema", w),
            side_effect=_field(o, "side_effect", w),
            category=_field(o, "category", w),
            concurrency_safe=_field(o, "concurrency_safe", w),
            approval=_field(o, "approval", w),
            timeout_ms=_field(o, "timeout_ms", w),
            retries=_field(o, "retries", w),
            state=_field(o, "state", w),
        )


@dataclass(frozen=True, slots=True)
class Approval:
    """A stored approval: exactly what ``execute`` will run, and why it needs a human."""

    approval_id: str
    tool: str
    arguments: Any
    input_digest: str
    argv_preview: tuple[str, ...]
    builtin: str | None
    profile: str
    timeout_ms: int
    session: str | None
    rule: str
    reason: str
    policy_version: str
    tool_version: str
    expires_at_ms: int

    @classmethod
    def from_json(cls, value: Any) -> Approval:
        o = _object(value, "approval")
        w = "approval"
        return cls(
            approval_id=_field(o, "approval_id", w),
            tool=_field(o, "tool", w),
            arguments=_field(o, "arguments", w),
            input_digest=_field(o, "input_digest", w),
            argv_preview=tuple(_field(o, "argv_preview", w)),
            builtin=_field(o, "builtin", w),
            profile=_field(o, "profile", w),
            timeout_ms=_field(o, "timeout_ms", w),
            session=_field(o, "session", w),
            rule=_field(o, "rule", w),
            reason=_field(o, "reason", w),
            policy_version=_field(o, "policy_version", w),
            tool_version=_field(o, "tool_version", w),
            expires_at_ms=_field(o, "expires_at_ms", w),
        )


@dataclass(frozen=True, slots=True)
class DryRun:
    """What a call would run, decided but not run (``call(..., dry_run=True)``)."""

    tool: str
    decision: Decision
    rule: str
    approval_required: bool
    argv: tuple[str, ...]
    builtin: str | None
    stdin_bytes: int
    env: tuple[tuple[str, str], ...]
    profile: str
    sandbox: dict[str, Any]
    timeout_ms: int
    input_digest: str

    @classmethod
    def from_json(cls, value: Any) -> DryRun:
        o = _object(value, "dry run")
        w = "dry run"
        return cls(
            tool=_field(o, "tool", w),
            decision=_field(o, "decision", w),
            rule=_field(o, "rule", w),
            approval_required=_field(o, "approval_required", w),
            argv=tuple(_field(o, "argv", w)),
            builtin=_field(o, "builtin", w),
            stdin_bytes=_field(o, "stdin_bytes", w),
            env=tuple((str(k), str(v)) for k, v in _field(o, "env", w)),
            profile=_field(o, "profile", w),
            sandbox=_field(o, "sandbox", w),
            timeout_ms=_field(o, "timeout_ms", w),
            input_digest=_field(o, "input_digest", w),
        )


@dataclass(frozen=True, slots=True)
class Health:
    """The ``health`` answer: airlock's release, the wire contract's version, and readiness
    (``ready`` is None from a daemon older than it)."""

    ok: bool
    version: str
    protocol_version: int
    policy_version: str
    ready: bool | None = None
    not_ready: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Health:
        o = _object(value, "health answer")
        w = "health answer"
        return cls(
            ok=_field(o, "ok", w),
            version=_field(o, "version", w),
            protocol_version=_field(o, "protocol_version", w),
            policy_version=_field(o, "policy_version", w),
            ready=o.get("ready"),
            not_ready=o.get("not_ready"),
        )


@dataclass(frozen=True, slots=True)
class StateChange:
    """The ``set_state`` answer: the tool and its new state."""

    tool: str
    state: ToolState

    @classmethod
    def from_json(cls, value: Any) -> StateChange:
        o = _object(value, "set_state answer")
        return cls(_field(o, "tool", "set_state answer"), _field(o, "state", "set_state answer"))


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """The ``session_set`` answer: the session and its plan mode now."""

    session: str
    plan_mode: bool

    @classmethod
    def from_json(cls, value: Any) -> SessionSettings:
        o = _object(value, "session_set answer")
        w = "session_set answer"
        return cls(_field(o, "session", w), _field(o, "plan_mode", w))


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """The ``session_open`` answer: the session's id and what it was opened with."""

    session: str
    """The id: 128 random bits, hex. Whoever holds it can use the session."""
    expires_at: int
    """When the daemon closes it unless used (ms since the Unix epoch), as of opening."""
    isolation: SessionIsolation
    """``copy`` when it started as a copy of its base, ``empty`` otherwise."""
    size: int
    """The workspace's size limit, in bytes."""

    @classmethod
    def from_json(cls, value: Any) -> SessionInfo:
        o = _object(value, "session_open answer")
        w = "session_open answer"
        return cls(**{name: _field(o, name, w) for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Change:
    """One path of a session's workspace that differs from its base (``changes``)."""

    path: str
    kind: ChangeKind
    size: int
    """The file's size now; 0 for ``deleted``."""

    @classmethod
    def from_json(cls, value: Any) -> Change:
        o = _object(value, "change")
        return cls(_field(o, "path", "change"), _field(o, "kind", "change"), _field(o, "size", "change"))


@dataclass(frozen=True, slots=True)
class Stats:
    """The daemon's counters and limits (``stats``)."""

    connections: int
    connections_open: int
    max_connections: int
    refused_peers: int
    requests: int
    calls: int
    in_flight: int
    queued: int
    overloaded: int
    input_bytes: int
    max_input_bytes: int
    input_refused: int
    output_bytes: int
    max_output_bytes: int
    closed_unread: int
    write_timeout_ms: int
    pending_approvals: int
    pool: dict[str, Any]
    """hits, misses, idle, idle_target, cgroups_reused, cgroups_kept, templates_built,
    templates_ready (the schema leaves this object open)."""
    warm_pools: int
    max_concurrent: int
    max_queued: int
    max_open_files: int
    """The daemon's soft open-file limit (raised to the hard limit at start)."""
    open_files_needed: int
    """Descriptors the daemon can hold at most with its flags (egress tunnels aside)."""
    sessions_open: int

    @classmethod
    def from_json(cls, value: Any) -> Stats:
        o = _object(value, "stats answer")
        w = "stats answer"
        return cls(**{name: _field(o, name, w) for name in cls.__dataclass_fields__})
