"""Egress allow-lists and secrets: the REST surface against the real gateway
(its own, started with --secrets-file and --egress-allow), environment
secrets over SSH, and the SDK's local checks and error classes.

Traffic through the egress proxy is the Go suite's business (cmd/sandgate);
nothing here sends any.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest
from conftest import Gateway, start_gateway
from test_unit import SESSION_JSON, FakeAPI

import sandbox_sessions_sdk as sdk
from sandbox_sessions_sdk import (
    EgressNotAllowedError,
    InvalidEgressError,
    InvalidSecretError,
    SandboxOperationError,
    Session,
    SessionsClient,
    SessionSSHClient,
    UnknownSecretError,
)

#: The values of the gateway's secrets: looked for where they must not be.
CANARY = "canary-" + secrets.token_hex(12)
BOUND_CANARY = "bound-" + secrets.token_hex(12)

#: The operator's ceiling on egress (serve --egress-allow).
EGRESS_ALLOW = ["pypi.org", "*.pythonhosted.org", "github.com:443", "*.github.com", "10.0.0.5"]


@pytest.fixture(scope="module")
def egw(sandgate_bin: str, scratch: Path) -> Iterator[Gateway]:
    """A gateway with secrets (CANARY_TOKEN and GH_TOKEN for every tenant,
    ONLY_OTHER for tenant 'other') and egress bounded to EGRESS_ALLOW."""
    main, other = secrets.token_hex(16), secrets.token_hex(16)
    gw = start_gateway(
        sandgate_bin,
        scratch,
        "--rate-limit",
        "100000",
        keys=[main, f"other:{other}"],
        secrets_file={"CANARY_TOKEN": CANARY, "GH_TOKEN": BOUND_CANARY, "other/ONLY_OTHER": "only-other"},
        egress_allow=EGRESS_ALLOW,
    )
    gw.other_token = other
    try:
        yield gw
    finally:
        gw.stop()
    log = gw.log()
    assert CANARY not in log and BOUND_CANARY not in log, "a secret's value is in the gateway's log"


@pytest.fixture
def eclient(egw: Gateway) -> Iterator[SessionsClient]:
    with SessionsClient(api_url=egw.url, bearer_token=egw.token) as c:
        created: List[str] = []
        create = c.create_session

        def tracked(*args: Any, **kwargs: Any) -> Session:
            s = create(*args, **kwargs)
            created.append(s.session_id)
            return s

        c.create_session = tracked  # type: ignore[method-assign]
        try:
            yield c
        finally:
            for sid in created:
                try:
                    c.delete_session(sid)
                except sdk.SessionNotFoundError:
                    pass


def no_canary(*objs: Any) -> bool:
    text = json.dumps(objs, default=str)
    return CANARY not in text and BOUND_CANARY not in text


# -- against the gateway -------------------------------------------------------------


def test_create_with_egress_shows_canonical_allow(eclient: SessionsClient) -> None:
    s = eclient.create_session(
        ttl=120, egress=["PyPI.org.", "*.PythonHosted.org", "github.com:443", "10.0.0.5:5432", "pypi.org"]
    )
    want = ["pypi.org", "*.pythonhosted.org", "github.com:443", "10.0.0.5:5432"]
    assert s.egress_allow == want
    assert s.egress == {"allow": want, "bytesIn": 0, "bytesOut": 0} == s.raw["egress"]
    assert (s.egress_bytes_in, s.egress_bytes_out) == (0, 0)
    assert s.secrets == [] and "secrets" not in s.raw
    got = eclient.get_session(s.session_id)
    assert got.egress_allow == want
    listed = [x for x in eclient.list_sessions(limit=100)["sessions"] if x.session_id == s.session_id]
    assert listed and listed[0].egress_allow == want
    # Without egress: no network, and the object is still there.
    d = eclient.create_session(ttl=120)
    assert d.egress == {"allow": [], "bytesIn": 0, "bytesOut": 0} and d.egress_allow == []
    e = eclient.create_session(ttl=120, egress=[])
    assert e.egress_allow == []


def test_update_session_egress(eclient: SessionsClient) -> None:
    s = eclient.create_session(ttl=300, egress=["pypi.org"])
    u = eclient.update_session(s.session_id, egress=("github.com:443", "*.GitHub.com"))
    assert u.egress_allow == ["github.com:443", "*.github.com"] and u.ttl == 300
    assert eclient.get_session(s.session_id).egress_allow == ["github.com:443", "*.github.com"]
    # ttl alone, or nothing at all, leaves the list as it is.
    assert eclient.update_session(s.session_id, ttl=600).egress_allow == ["github.com:443", "*.github.com"]
    assert eclient.update_session(s.session_id).egress_allow == ["github.com:443", "*.github.com"]
    # Refused changes change nothing.
    with pytest.raises(EgressNotAllowedError) as ei:
        eclient.update_session(s.session_id, egress=["evil.net"])
    assert ei.value.entries == ["evil.net"]
    with pytest.raises(InvalidEgressError):
        eclient.update_session(s.session_id, egress=["https://pypi.org/simple"])
    assert eclient.get_session(s.session_id).egress_allow == ["github.com:443", "*.github.com"]
    # [] takes the network away; both at once.
    c = eclient.update_session(s.session_id, ttl=900, egress=[])
    assert c.egress_allow == [] and c.ttl == 900
    assert eclient.get_session(s.session_id).egress_allow == []
    # A session created without egress can be given some later.
    n = eclient.create_session(ttl=120)
    assert eclient.update_session(n.session_id, egress=["pypi.org"]).egress_allow == ["pypi.org"]


def driver(gw: Gateway) -> str:
    """The gateway's sandbox driver, from its start-up log line."""
    m = re.search(r"\bsandbox=(\w+)", gw.log())
    assert m, "the gateway's log does not name its sandbox driver"
    return m.group(1)


def test_env_secret_reaches_commands_not_the_api(egw: Gateway, eclient: SessionsClient) -> None:
    s = eclient.create_session(ttl=300, secrets=["CANARY_TOKEN"])
    assert s.secrets == ["CANARY_TOKEN"] and s.secret_names == ["CANARY_TOKEN"]
    got = eclient.get_session(s.session_id)
    assert got.secrets == ["CANARY_TOKEN"]
    assert no_canary(s.raw, got.raw, [x.raw for x in eclient.list_sessions(limit=100)["sessions"]])
    with SessionSSHClient(api_url=egw.url, bearer_token=egw.token, session_id=s.session_id, username="sandbox") as ssh:
        res = ssh.run_command("printenv CANARY_TOKEN")
        assert res.exit_code == 0 and res.stdout == CANARY + "\n"
    # A session that did not ask for it does not have it.
    plain = eclient.create_session(ttl=120)
    with SessionSSHClient(
        api_url=egw.url, bearer_token=egw.token, session_id=plain.session_id, username="sandbox"
    ) as ssh:
        assert ssh.run_command("printenv CANARY_TOKEN").exit_code == 1


def test_bound_secret_is_a_placeholder_inside(egw: Gateway, eclient: SessionsClient) -> None:
    refs = ["CANARY_TOKEN", {"name": "GH_TOKEN", "hosts": ["api.github.com"]}]
    if driver(egw) != "linux":
        # Only the linux driver can add the egress CA to a sandbox's trust store.
        with pytest.raises(SandboxOperationError) as ei:
            eclient.create_session(ttl=120, egress=["api.github.com"], secrets=refs)
        assert ei.value.status_code == 400 and ei.value.code == "egress_unsupported"
        return
    s = eclient.create_session(ttl=300, egress=["api.github.com"], secrets=refs)
    bound = {"name": "GH_TOKEN", "hosts": ["api.github.com"], "header": "Authorization", "format": "Bearer {value}"}
    assert s.secrets == ["CANARY_TOKEN", bound]
    assert s.secret_names == ["CANARY_TOKEN", "GH_TOKEN"]
    got = eclient.get_session(s.session_id)
    assert got.secrets == s.secrets
    assert no_canary(s.raw, got.raw, [x.raw for x in eclient.list_sessions(limit=100)["sessions"]])
    with SessionSSHClient(api_url=egw.url, bearer_token=egw.token, session_id=s.session_id, username="sandbox") as ssh:
        assert ssh.run_command("printenv CANARY_TOKEN").stdout == CANARY + "\n"
        res = ssh.run_command("printenv GH_TOKEN")
        assert res.exit_code == 0 and res.stdout.strip() and BOUND_CANARY not in res.stdout


def test_tenant_scoped_secret(egw: Gateway) -> None:
    assert egw.other_token is not None
    with SessionsClient(api_url=egw.url, bearer_token=egw.other_token) as other:
        s = other.create_session(ttl=120, secrets=["ONLY_OTHER"])
        try:
            assert s.secrets == ["ONLY_OTHER"]
        finally:
            other.delete_session(s.session_id)


def test_unknown_secret(eclient: SessionsClient) -> None:
    before = eclient.list_sessions()["total"]
    with pytest.raises(UnknownSecretError) as ei:
        eclient.create_session(ttl=120, secrets=["NOPE", "CANARY_TOKEN", "ONLY_OTHER"])
    e = ei.value
    assert isinstance(e, SandboxOperationError)
    assert e.status_code == 400 and e.code == "unknown_secret"
    assert "NOPE" in e.message and "ONLY_OTHER" in e.message and "CANARY_TOKEN" not in e.message
    assert e.names == ["NOPE", "ONLY_OTHER"]
    assert eclient.list_sessions()["total"] == before


def test_egress_outside_the_operators_bounds(eclient: SessionsClient) -> None:
    with pytest.raises(EgressNotAllowedError) as ei:
        eclient.create_session(ttl=120, egress=["pypi.org", "evil.net", "github.com:22", "*.pythonhosted.org"])
    e = ei.value
    assert e.status_code == 400 and e.code == "egress_not_allowed"
    assert "evil.net" in e.message and "github.com:22" in e.message
    assert e.entries == ["evil.net", "github.com:22"]


def test_invalid_egress_entry(eclient: SessionsClient) -> None:
    with pytest.raises(InvalidEgressError) as ei:
        eclient.create_session(ttl=120, egress=["pypi.org", "http://x/y"])
    e = ei.value
    assert isinstance(e, SandboxOperationError)
    assert e.status_code == 400 and e.code == "invalid_egress" and "http://x/y" in e.message
    with pytest.raises(InvalidEgressError) as ei:
        eclient.create_session(ttl=120, egress=["*"])
    assert ei.value.code == "invalid_egress"


def test_bound_secret_outside_the_sessions_egress(eclient: SessionsClient) -> None:
    with pytest.raises(EgressNotAllowedError) as ei:
        eclient.create_session(
            ttl=120, egress=["pypi.org"], secrets=[{"name": "GH_TOKEN", "hosts": ["api.github.com"]}]
        )
    e = ei.value
    assert e.code == "egress_not_allowed" and "GH_TOKEN" in e.message and "api.github.com" in e.message
    assert e.entries == ["api.github.com"]
    # The session's list on port 443 only does not cover a host on 80 and 443.
    with pytest.raises(EgressNotAllowedError):
        eclient.create_session(
            ttl=120, egress=["api.github.com:443"], secrets=[{"name": "GH_TOKEN", "hosts": ["api.github.com"]}]
        )
    # No egress at all: the secret cannot be bound anywhere.
    with pytest.raises(EgressNotAllowedError):
        eclient.create_session(ttl=120, secrets=[{"name": "GH_TOKEN", "hosts": ["api.github.com"]}])


@pytest.mark.parametrize(
    "refs",
    [
        ["not-a-name"],
        ["CANARY_TOKEN", "CANARY_TOKEN"],
        [{"name": "CANARY_TOKEN", "header": "X-Token"}],
        [{"name": "GH_TOKEN", "hosts": ["pypi.org"], "format": "no placeholder"}],
        [{"name": "GH_TOKEN", "hosts": ["pypi.org"], "header": "Host"}],
    ],
)
def test_invalid_secret(eclient: SessionsClient, refs: List[Any]) -> None:
    with pytest.raises(InvalidSecretError) as ei:
        eclient.create_session(ttl=120, egress=["pypi.org"], secrets=refs)
    assert ei.value.status_code == 400 and ei.value.code == "invalid_secret"


# -- without a gateway ------------------------------------------------------------------


@pytest.fixture
def fake_api() -> Iterator[FakeAPI]:
    api = FakeAPI()
    yield api
    api.close()


@pytest.mark.parametrize(
    "call,exc",
    [
        (lambda c: c.create_session(egress="pypi.org"), TypeError),
        (lambda c: c.create_session(egress=b"pypi.org"), TypeError),
        (lambda c: c.create_session(egress={"pypi.org"}), TypeError),
        (lambda c: c.create_session(egress=["pypi.org", 443]), TypeError),
        (lambda c: c.create_session(egress=["pypi.org", None]), TypeError),
        (lambda c: c.create_session(egress=["pypi.org", ""]), ValueError),
        (lambda c: c.create_session(egress=["  "]), ValueError),
        (lambda c: c.create_session(secrets="PYPI_TOKEN"), TypeError),
        (lambda c: c.create_session(secrets={"name": "PYPI_TOKEN"}), TypeError),
        (lambda c: c.create_session(secrets=[""]), ValueError),
        (lambda c: c.create_session(secrets=[42]), TypeError),
        (lambda c: c.create_session(secrets=[{"hosts": ["pypi.org"]}]), ValueError),
        (lambda c: c.create_session(secrets=[{"name": ""}]), ValueError),
        (lambda c: c.create_session(secrets=[{"name": 1}]), TypeError),
        (lambda c: c.create_session(secrets=[{"name": "T", "hosts": "pypi.org"}]), TypeError),
        (lambda c: c.create_session(secrets=[{"name": "T", "hosts": [""]}]), ValueError),
        (lambda c: c.create_session(secrets=[{"name": "T", "header": 1}]), TypeError),
        (lambda c: c.create_session(secrets=[{"name": "T", "format": ""}]), ValueError),
        (lambda c: c.create_session(secrets=[{"name": "T", "value": "x"}]), ValueError),
        (lambda c: c.update_session("sbx-abc", egress="pypi.org"), TypeError),
        (lambda c: c.update_session("sbx-abc", egress=[1]), TypeError),
        (lambda c: c.update_session("sbx-abc", egress=[""]), ValueError),
    ],
)
def test_arguments_checked_before_sending(
    fake_api: FakeAPI, call: Callable[[SessionsClient], object], exc: type
) -> None:
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(exc):
            call(c)
    assert fake_api.calls == []


def test_bodies_as_the_api_names_them(fake_api: FakeAPI) -> None:
    fake_api.answer = (201, {}, json.dumps(SESSION_JSON).encode())
    with SessionsClient(fake_api.url, "t") as c:
        c.create_session(
            ttl=60,
            egress=("pypi.org", "*.pythonhosted.org"),
            secrets=("PYPI_TOKEN", {"name": "GITHUB_TOKEN", "hosts": ("api.github.com",), "header": None}),
        )
        c.create_session(ttl=60, egress=[], secrets=[])
        fake_api.answer = (200, {}, json.dumps(SESSION_JSON).encode())
        c.update_session("sbx-abc")
        c.update_session("sbx-abc", egress=[])
        c.update_session("sbx-abc", ttl=600, egress=["github.com:443"])
    bodies = [(m, json.loads(b)) for m, _, _, b in fake_api.calls]
    assert bodies == [
        (
            "POST",
            {
                "ttl": 60,
                "egress": ["pypi.org", "*.pythonhosted.org"],
                "secrets": ["PYPI_TOKEN", {"name": "GITHUB_TOKEN", "hosts": ["api.github.com"]}],
            },
        ),
        ("POST", {"ttl": 60, "egress": [], "secrets": []}),
        ("PATCH", {}),
        ("PATCH", {"egress": []}),
        ("PATCH", {"ttl": 600, "egress": ["github.com:443"]}),
    ]


@pytest.mark.parametrize(
    "code,cls",
    [
        ("invalid_egress", InvalidEgressError),
        ("egress_not_allowed", EgressNotAllowedError),
        ("unknown_secret", UnknownSecretError),
        ("invalid_secret", InvalidSecretError),
        ("egress_unavailable", SandboxOperationError),
        ("egress_unsupported", SandboxOperationError),
    ],
)
def test_error_codes_map_to_classes(fake_api: FakeAPI, code: str, cls: type) -> None:
    fake_api.answer = (
        400,
        {"Content-Type": "application/json"},
        json.dumps({"error": {"code": code, "message": "m"}}).encode(),
    )
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(cls) as ei:
            c.create_session(ttl=60)
    assert type(ei.value) is cls and isinstance(ei.value, SandboxOperationError)
    assert ei.value.code == code and ei.value.status_code == 400
    for name in ("InvalidEgressError", "EgressNotAllowedError", "UnknownSecretError", "InvalidSecretError"):
        assert name in sdk.__all__ and issubclass(getattr(sdk, name), SandboxOperationError)


def test_error_details_parsed_from_the_message() -> None:
    e = UnknownSecretError("create session: HTTP 400 unknown_secret: unknown secrets: A, B_2")
    assert e.names == ["A", "B_2"]
    e2 = EgressNotAllowedError(
        "create session: HTTP 400 egress_not_allowed: egress entries outside what this gateway allows"
        ' (serve --egress-allow): "evil.net", "[2001:db8::1]:443"'
    )
    assert e2.entries == ["evil.net", "[2001:db8::1]:443"]
    assert EgressNotAllowedError("no entries named").entries == []


def test_session_egress_fields() -> None:
    old = Session.from_dict(SESSION_JSON)
    assert old.egress is None and old.egress_allow == [] and old.secrets == []
    assert old.egress_bytes_in is None and old.egress_bytes_out is None and old.secret_names == []
    data = dict(
        SESSION_JSON,
        egress={"allow": ["pypi.org", "github.com:443"], "bytesIn": 1234, "bytesOut": 56},
        secrets=["PYPI_TOKEN", {"name": "GH", "hosts": ["api.github.com"], "header": "Authorization"}],
    )
    s = Session.from_dict(data)
    assert s.egress == data["egress"] and s.egress is not data["egress"]
    assert s.egress_allow == ["pypi.org", "github.com:443"]
    assert (s.egress_bytes_in, s.egress_bytes_out) == (1234, 56)
    assert s.secrets == data["secrets"] and s.secret_names == ["PYPI_TOKEN", "GH"]
    # Positional construction as before still works; the new fields default.
    p = Session("sbx-x", "running", "default", {}, None, None)
    assert p.egress is None and p.secrets == []


# -- rules per request, decisions and approvals ----------------------------------------


RULE = {"host": "api.github.com", "port": 443, "methods": ["get", "POST"], "paths": ["/repos/acme/*"]}


def test_rule_objects_decisions_and_approvals(eclient: SessionsClient) -> None:
    s = eclient.create_session(ttl=120, egress=["pypi.org", RULE], egress_mode="ask")
    want = {"host": "api.github.com", "port": 443, "methods": ["GET", "POST"], "paths": ["/repos/acme/*"]}
    assert s.egress_allow == ["pypi.org", want]
    assert s.egress_mode == "ask" and eclient.get_session(s.session_id).egress_mode == "ask"
    assert eclient.list_egress_pending(s.session_id) == []
    page = eclient.list_egress_decisions(s.session_id, limit=10)
    assert page.decisions == [] and page.next_cursor is None
    with pytest.raises(SandboxOperationError) as ei:
        eclient.decide_egress(s.session_id, "nope", "allow", remember=True)
    assert ei.value.status_code == 404 and ei.value.code == "pending_not_found"
    assert not isinstance(ei.value, sdk.SessionNotFoundError)
    # A rule object through update, and the default mode.
    u = eclient.update_session(s.session_id, egress=[RULE])
    assert u.egress_allow == [want]
    d = eclient.create_session(ttl=120, egress=[RULE])
    assert d.egress_mode == "deny"


def test_rule_objects_and_approvals_async(egw: Gateway) -> None:
    import asyncio

    async def main() -> None:
        async with sdk.AsyncSessionsClient(api_url=egw.url, bearer_token=egw.token) as c:
            s = await c.create_session(ttl=120, egress=[RULE], egress_mode="ask")
            try:
                assert s.egress_mode == "ask" and s.egress_allow[0]["host"] == "api.github.com"
                assert await c.list_egress_pending(s.session_id) == []
                assert (await c.list_egress_decisions(s.session_id)).decisions == []
                with pytest.raises(SandboxOperationError) as ei:
                    await c.decide_egress(s.session_id, "nope", "deny")
                assert ei.value.code == "pending_not_found"
            finally:
                await c.delete_session(s.session_id)

    asyncio.run(main())


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda c: c.create_session(egress=[{"port": 443}]), ValueError),
        (lambda c: c.create_session(egress=[{"host": "a.b", "path": ["/x"]}]), ValueError),
        (lambda c: c.create_session(egress=[{"host": "a.b", "methods": "GET"}]), TypeError),
        (lambda c: c.create_session(egress=[{"host": "a.b", "port": 0}]), ValueError),
        (lambda c: c.create_session(egress=[42]), TypeError),
        (lambda c: c.create_session(egress_mode="sometimes"), ValueError),
        (lambda c: c.decide_egress("sid", "p", "maybe"), ValueError),
        (lambda c: c.decide_egress("sid", "", "allow"), ValueError),
        (lambda c: c.list_egress_decisions("sid", limit=0), ValueError),
    ],
)
def test_egress_local_checks(call: Callable[[SessionsClient], Any], exc: type) -> None:
    with SessionsClient(api_url="http://127.0.0.1:9", bearer_token="t") as c:
        with pytest.raises(exc):
            call(c)


def test_follow_and_decide_a_parked_connection(sandgate_bin: str, scratch: Path) -> None:
    """On the workdir driver a command's HTTP_PROXY is the session's proxy:
    curl to a host outside an ask-mode session's list is parked; the
    follower sees it, decide_egress lets it through, and the follower sees
    it resolved."""
    import http.server
    import threading
    import time

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"hello from upstream\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    port = up.server_address[1]
    gw = start_gateway(
        sandgate_bin, scratch, "--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", "ask.test=127.0.0.1"
    )
    try:
        with SessionsClient(api_url=gw.url, bearer_token=gw.token) as c:
            s = c.create_session(ttl=300, egress=["ok.test:1"], egress_mode="ask")
            events: List[Any] = []
            follow = c.follow_egress_pending(s.session_id)

            def read() -> None:
                try:
                    for ev in follow:
                        events.append(ev)
                        if ev.event == "resolved":
                            return
                except Exception as e:  # noqa: BLE001 (the assertion below names it)
                    events.append(e)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            p = c.start_process(s.session_id, f"curl -sS --max-time 60 http://ask.test:{port}/")
            deadline = time.monotonic() + 60
            while not events and time.monotonic() < deadline:
                time.sleep(0.05)
            assert events and events[0].event == "pending", events
            pending = events[0].pending
            assert pending.host == "ask.test" and pending.port == port and pending.via == "proxy"
            assert [x.id for x in c.list_egress_pending(s.session_id)] == [pending.id]
            c.decide_egress(s.session_id, pending.id, "allow")
            reader.join(60)
            assert [e.event for e in events] == ["pending", "resolved"] and events[1].pending.id == pending.id
            out = "".join(line.get("stdout", "") for line in c.process_output(s.session_id, p["processId"], follow=True))
            assert out == "hello from upstream\n"
            decisions = c.list_egress_decisions(s.session_id).decisions
            assert any(d.kind == "ask" and d.allowed and d.host == "ask.test" for d in decisions), decisions
            c.delete_session(s.session_id)
    finally:
        gw.stop()
        up.shutdown()
