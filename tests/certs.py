"""Test TLS material made with openssl: a CA, a server certificate for 127.0.0.1 and
localhost, and a client certificate (shared by the agent's and the tuner's tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_certs(tmp: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl)."""
    tmp.mkdir(parents=True, exist_ok=True)
    if (tmp / "server.pem").exists():
        return {p.name: str(p) for p in tmp.iterdir()}

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
    return {p.name: str(p) for p in tmp.iterdir()}
