"""The SDK, unchanged, on a session that runs on an OCI image.

The image is built here with the standard library only: an OCI image layout
directory (``oci-layout``, ``index.json``, ``blobs/sha256/...``) whose one
uncompressed tar layer holds the host's static busybox (Debian's
busybox-static) and ``/etc/image-name``. ``sandgate image import`` stores it
in the data dir of a gateway that runs ``--sandbox linux`` (while it serves),
and the session is created with ``image=NAME``.

The linux driver needs root and user namespaces, and the layer needs
``/bin/busybox``: without them the test fails under ``CI=true`` and is
skipped elsewhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest
from conftest import Gateway, fail_or_skip, start_gateway, wait_gone

from sandbox_sessions_sdk import CommandTimeoutError, SessionNotFoundError, SessionsClient, SessionSSHClient

BUSYBOX = "/bin/busybox"
IMAGE_NAME = "sdk-busybox"
# Applets the test's commands use, linked to bin/busybox (those this busybox has).
APPLETS = ("sh", "cat", "echo", "id", "pwd", "ls", "sleep", "sha256sum", "rm", "mkdir", "true", "env")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def goarch() -> str:
    m = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)


def layer_tar(busybox: bytes, applets: Tuple[str, ...], image_name: str) -> bytes:
    """An uncompressed tar layer: bin/busybox, applet symlinks, etc/image-name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, type_: bytes, mode: int, body: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = type_, mode, 1_700_000_000, link
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body else None)

        add("bin", tarfile.DIRTYPE, 0o755)
        add("bin/busybox", tarfile.REGTYPE, 0o755, busybox)
        for a in applets:
            add(f"bin/{a}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("etc", tarfile.DIRTYPE, 0o755)
        add("etc/image-name", tarfile.REGTYPE, 0o644, (image_name + "\n").encode())
    return buf.getvalue()


def write_blob(layout: Path, data: bytes) -> Dict[str, object]:
    """Store *data* under blobs/sha256/ and return its digest and size."""
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def build_oci_layout(layout: Path, busybox: bytes, applets: Tuple[str, ...], image_name: str) -> str:
    """Write an OCI image layout at *layout*; return the manifest's digest."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    layer = layer_tar(busybox, applets, image_name)
    layer_desc = {"mediaType": OCI_LAYER, **write_blob(layout, layer)}
    config = {
        "architecture": goarch(),
        "os": "linux",
        "config": {"Env": ["PATH=/bin", "IMAGE_VAR=x"], "WorkingDir": "/workspace"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created_by": "sandgate sdk-python tests"}],
    }
    config_desc = {"mediaType": OCI_CONFIG, **write_blob(layout, json.dumps(config).encode())}
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc, "layers": [layer_desc]}
    manifest_desc = {"mediaType": OCI_MANIFEST, **write_blob(layout, json.dumps(manifest).encode())}
    manifest_desc["platform"] = {"architecture": goarch(), "os": "linux"}
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": "latest"}
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [manifest_desc]}
    (layout / "index.json").write_text(json.dumps(index))
    return str(manifest_desc["digest"])


def busybox_applets() -> Tuple[str, ...]:
    res = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, timeout=10)
    have = set(res.stdout.split())
    missing = {"sh", "cat", "echo", "id", "pwd", "sleep"} - have
    if res.returncode != 0 or missing:
        fail_or_skip(f"{BUSYBOX} lacks applets {sorted(missing)} (exit {res.returncode})")
    return tuple(a for a in APPLETS if a in have)


@pytest.fixture(scope="module")
def image_gateway(sandgate_bin: str, scratch: Path) -> Iterator[Tuple[Gateway, str]]:
    """A gateway on the linux driver with IMAGE_NAME imported; (gateway, manifest digest)."""
    if os.geteuid() != 0 or not os.path.exists("/proc/self/ns/user"):
        fail_or_skip("image sessions need the linux sandbox driver: root and user namespaces")
    if not (os.path.isfile(BUSYBOX) and os.access(BUSYBOX, os.X_OK)):
        fail_or_skip(f"no {BUSYBOX} for the image's layer (apt-get install busybox-static)")
    applets = busybox_applets()
    layout = scratch / f"oci-{uuid.uuid4().hex[:8]}"
    digest = build_oci_layout(layout, Path(BUSYBOX).read_bytes(), applets, IMAGE_NAME)
    gw = start_gateway(sandgate_bin, scratch, "--sandbox", "linux")
    try:
        # Imported while the gateway serves, into the data dir it uses.
        data_dir = os.path.join(gw.data_dir, "data")
        res = subprocess.run(
            [sandgate_bin, "image", "import", "--name", IMAGE_NAME, "--data-dir", data_dir, str(layout)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, f"image import: exit {res.returncode}: {res.stdout}{res.stderr}"
        yield gw, digest
    finally:
        shutil.rmtree(layout, ignore_errors=True)
        gw.stop()


def test_sdk_on_image_session(image_gateway: Tuple[Gateway, str], tmp_path: Path) -> None:
    gw, digest = image_gateway
    with SessionsClient(api_url=gw.url, bearer_token=gw.token) as client:
        s = client.create_session(ttl=600, image=IMAGE_NAME, metadata={"test": "image"})
        try:
            assert s.image == IMAGE_NAME and s.status == "running" and s.password
            assert s.raw.get("imageDigest") == digest, s.raw
            got = client.get_session(s.session_id)
            assert got.image == IMAGE_NAME and got.raw.get("imageDigest") == digest, got.raw

            with SessionSSHClient(gw.url, gw.token, s.session_id, "sandbox") as ssh:
                r = ssh.run_command("cat /etc/image-name; echo $IMAGE_VAR; id -un; pwd")
                assert (r.stdout, r.stderr, r.exit_code) == (f"{IMAGE_NAME}\nx\nsandbox\n/workspace\n", "", 0), r

                # SFTP round trip through the workspace (the sftp-server in an
                # image sandbox is the gateway's static binary).
                payload = os.urandom(200_000) + b"\nimage round trip\n"
                local_up, local_down = tmp_path / "up.bin", tmp_path / "down.bin"
                local_up.write_bytes(payload)
                ssh.upload_file(local_up, "/workspace/up.bin")
                r = ssh.run_command("sha256sum /workspace/up.bin", timeout=10)
                assert r.exit_code == 0 and r.stdout.split()[0] == hashlib.sha256(payload).hexdigest(), r
                ssh.upload_file(local_up, "relative.bin")  # relative: the workspace (WorkingDir)
                assert ssh.run_command("ls /workspace/relative.bin").stdout == "/workspace/relative.bin\n"
                ssh.download_file("/workspace/up.bin", local_down)
                assert local_down.read_bytes() == payload

                # A timeout that does not fire, then one that does: the command
                # is killed and the connection stays usable.
                r = ssh.run_command("echo in-time", timeout=10)
                assert (r.stdout, r.exit_code) == ("in-time\n", 0)
                marker = f"31.{uuid.uuid4().int % 10**6:06d}"  # `sleep 31.x`, findable on the host
                t0 = time.monotonic()
                with pytest.raises(CommandTimeoutError) as ei:
                    ssh.run_command(f"echo started; exec sleep {marker}", timeout=1)
                assert 0.9 <= time.monotonic() - t0 < 4
                assert ei.value.stdout == "started\n" and ei.value.timeout == 1
                assert wait_gone(f"sleep {marker}") == [], "the timed-out command must be killed"
                assert ssh.run_command("echo after; echo $IMAGE_VAR").stdout == "after\nx\n"
        finally:
            try:
                client.delete_session(s.session_id)
            except SessionNotFoundError:
                pass
        with pytest.raises(SessionNotFoundError):
            client.get_session(s.session_id)
