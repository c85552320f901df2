"""redis-server processes that require a password, an ACL user or TLS, for the tests of
Redis AUTH and TLS (Debian's redis-server 7 is built with TLS)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis
import redis.exceptions

from sluice.broker.redis_server import free_port

#: the password of every secured test Redis; tests look for it in command lines and logs.
PASSWORD = "s3cret-Pa55word-7f1c"
#: the ACL user of the ACL mode.
ACL_USER = "sluice-app"
#: the key prefix the ACL user may use (its only keys); every other key is refused.
ACL_PREFIX = "sluice-acl:"


@dataclass(frozen=True)
class Certificates:
    """PEM files: a CA, a server certificate for 127.0.0.1/localhost, a client one."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> Certificates:
    """A throwaway CA and a server and a client certificate signed by it (1 day)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=sluice-test-ca", "-keyout", str(ca_key), "-out", str(ca),
    )  # fmt: skip
    made = {}
    for name, extension in (
        ("server", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        key, csr, cert = (directory / f"{name}.{s}" for s in ("key", "csr", "crt"))
        ext = directory / f"{name}.ext"
        ext.write_text(extension + "\n")
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(key), "-out", str(csr),
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert),
        )  # fmt: skip
        made[name] = (cert, key)
    return Certificates(ca, *made["server"], *made["client"])


@dataclass(frozen=True)
class SecuredRedis:
    """A running secured redis-server and the URL that logs in to it."""

    process: subprocess.Popen[bytes]
    url: str
    #: the same Redis with a wrong password (or, for TLS, no client certificate)
    wrong_url: str


def tls_url(port: int, certs: Certificates, password: str = PASSWORD) -> str:
    """``rediss://`` URL with the CA and the client certificate and key."""
    return (
        f"rediss://:{quote(password)}@127.0.0.1:{port}/0?ssl_cert_reqs=required"
        f"&ssl_ca_certs={certs.ca}&ssl_certfile={certs.client_cert}"
        f"&ssl_keyfile={certs.client_key}"
    )


@contextlib.contextmanager
def secured_redis(mode: str, directory: Path, timeout_s: float = 30.0) -> Iterator[SecuredRedis]:
    """Start a redis-server on a free port that requires a password (``password``), an
    ACL user (``acl``: the default user disabled; the user has the keys under
    :data:`ACL_PREFIX` and every command but those of ``@dangerous``) or TLS with client
    certificates and a password (``tls``: no plain TCP port); stopped on exit.

    Raises:
        RuntimeError: it did not answer within ``timeout_s``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = ["--save", "", "--appendonly", "no", "--dir", str(directory), "--bind", "127.0.0.1"]
    if mode == "password":
        args += ["--port", str(port), "--requirepass", PASSWORD]
        url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
        wrong = f"redis://:not-{PASSWORD}@127.0.0.1:{port}/0"
    elif mode == "acl":
        args += ["--port", str(port), "--user", "default", "off"]
        args += ["--user", ACL_USER, "on", f">{PASSWORD}", f"~{ACL_PREFIX}*", "&*"]
        args += ["+@all", "-@dangerous"]
        url = f"redis://{ACL_USER}:{PASSWORD}@127.0.0.1:{port}/0"
        wrong = f"redis://{ACL_USER}:not-{PASSWORD}@127.0.0.1:{port}/0"
    elif mode == "tls":
        certs = make_certificates(directory / "certs")
        args += ["--port", "0", "--tls-port", str(port), "--requirepass", PASSWORD]
        args += ["--tls-cert-file", str(certs.server_cert), "--tls-key-file"]
        args += [str(certs.server_key), "--tls-ca-cert-file", str(certs.ca)]
        url = tls_url(port, certs)
        wrong = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={certs.ca}"
    else:
        raise ValueError(f"unknown mode '{mode}'")
    log = (directory / "redis.log").open("wb")
    process = subprocess.Popen(["redis-server", *args], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with redis.Redis.from_url(url, socket_timeout=2) as client:
                    client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(
                        f"redis-server ({mode}) did not answer: "
                        + (directory / "redis.log").read_text(errors="replace")
                    ) from None
                time.sleep(0.1)
        yield SecuredRedis(process, url, wrong)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()
