"""Test TLS material made with openssl: a CA, a server certificate for 127.0.0.1 and
localhost, and a client certificate (shared by the agent's and the tuner's tests).

The set is made once per test process and copied where each test asks: three RSA-2048 keys
are a prime search each (0.1-1 s of CPU)."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
from pathlib import Path

_made: Path | None = None  # this process's set


def make_certs(tmp: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate in ``tmp``."""
    global _made
    tmp.mkdir(parents=True, exist_ok=True)
    if not (tmp / "server.pem").exists():
        if _made is None:
            made = Path(tempfile.mkdtemp(prefix="rdtune-test-certs-"))
            atexit.register(shutil.rmtree, made, True)
            _make(made)
            _made = made
        for path in _made.iterdir():
            shutil.copy2(path, tmp / path.name)
    return {p.name: str(p) for p in tmp.iterdir()}


def _make(tmp: Path) -> None:
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    ssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=rdtune test CA",
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        ssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        (tmp / f"{name}.ext").write_text(ext + "\n")
        ssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
        )
