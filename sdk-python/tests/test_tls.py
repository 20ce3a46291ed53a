"""HTTPS: verify_ssl for REST and for the CONNECT tunnel (sandgate --tls-cert)."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from pathlib import Path
from typing import Iterator, Tuple

import pytest
from conftest import Gateway, echo_from_threads, start_gateway
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandbox_sessions_sdk import (
    HTTPConnectTunnel,
    SandboxConnectionError,
    SessionsClient,
    SessionSSHClient,
    TLSStream,
)


def _self_signed(dir: Path) -> Tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandgate-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = dir / "cert.pem", dir / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def tls_gateway(sandgate_bin: str, scratch: Path) -> Iterator[Tuple[Gateway, str]]:
    d = scratch / "tls"
    d.mkdir(exist_ok=True)
    cert, key = _self_signed(d)
    gw = start_gateway(
        sandgate_bin, scratch, "--tls-cert", cert, "--tls-key", key, keys=[secrets.token_hex(16)], scheme="https"
    )
    try:
        yield gw, cert
    finally:
        gw.stop()


def test_untrusted_certificate_is_refused(tls_gateway: Tuple[Gateway, str]) -> None:
    gw, _ = tls_gateway
    with SessionsClient(gw.url, gw.token) as c:
        with pytest.raises(SandboxConnectionError, match="TLS"):
            c.list_sessions()
    with pytest.raises(SandboxConnectionError, match="TLS"):
        HTTPConnectTunnel(gw.url, gw.token, "sbx-whatever", timeout=5).open()


@pytest.mark.parametrize("verify", ["cert", False])
def test_https_with_ca_bundle_or_no_verification(tls_gateway: Tuple[Gateway, str], verify: object) -> None:
    gw, cert = tls_gateway
    verify_ssl = cert if verify == "cert" else False
    with SessionsClient(gw.url, gw.token, verify_ssl=verify_ssl) as c:  # type: ignore[arg-type]
        s = c.create_session(ttl=60)
        try:
            with SessionSSHClient(gw.url + "/v1", gw.token, s.session_id, "sandbox", verify_ssl=verify_ssl) as ssh:  # type: ignore[arg-type]
                assert ssh.run_command("echo tls")["stdout"] == "tls\n"
                # The tunnel socket is TLS, and still SSH inside.
                assert isinstance(ssh.transport.sock, TLSStream)
                assert ssh.transport.sock.version() in ("TLSv1.2", "TLSv1.3")
        finally:
            c.delete_session(s.session_id)


def test_tls_tunnel_survives_concurrent_reads_and_writes(tls_gateway: Tuple[Gateway, str], tmp_path: Path) -> None:
    """Paramiko reads the tunnel in its transport thread while callers write.

    An ssl.SSLSocket shared that way broke about one connection in ten
    (a spurious end of stream mid-command); several connections, each with
    commands and an upload/download in flight at once, catch a regression.
    """
    gw, cert = tls_gateway
    payload = secrets.token_bytes(3 << 20)
    src = tmp_path / "up.bin"
    src.write_bytes(payload)
    with SessionsClient(gw.url, gw.token, verify_ssl=cert) as c:
        s = c.create_session(ttl=120)
        try:
            for conn in range(6):
                with SessionSSHClient(gw.url + "/v1", gw.token, s.session_id, "sandbox", verify_ssl=cert) as ssh:
                    finish = echo_from_threads(ssh)
                    dst = tmp_path / f"down{conn}.bin"
                    ssh.upload_file(src, f"/tmp/up{conn}.bin")
                    ssh.download_file(f"/tmp/up{conn}.bin", dst)
                    err = finish()
                    assert err is None, f"connection {conn}: {err!r}"
                    assert dst.read_bytes() == payload
        finally:
            c.delete_session(s.session_id)
