"""CURVE keys: generation (`python -m shared.keys --dir DIR`, used by `make keys`) and loading.

Layout of DIR: server.key / server.key_secret (the head), client.key / client.key_secret (the
collectors), and authorized_clients/ holding the public keys the head accepts. Every head
socket is a CURVE server; a ZAP authenticator admits only keys in authorized_clients/ and
logs each refusal ("ZAP DENIED") so a misconfigured collector is visible at the head.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)
AUTHORIZED = "authorized_clients"


@dataclass(frozen=True)
class CurveServer:
    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


@dataclass(frozen=True)
class CurveClient:
    public: bytes
    secret: bytes
    server_public: bytes

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server_public


def generate(directory: str | os.PathLike[str], overwrite: bool = False) -> Path:
    """Create server and client key pairs plus authorized_clients/ (secret files mode 0600)."""
    root = Path(directory)
    if (root / "server.key_secret").exists() and not overwrite:
        raise FileExistsError(f"{root} already holds keys (pass --overwrite to replace them)")
    root.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(str(root), "server")
    zmq.auth.create_certificates(str(root), "client")
    auth = root / AUTHORIZED
    auth.mkdir(exist_ok=True)
    shutil.copy(root / "client.key", auth / "client.key")
    for secret in root.glob("*.key_secret"):
        secret.chmod(0o600)
    return root


def load_server(directory: str | os.PathLike[str]) -> CurveServer:
    public, secret = zmq.auth.load_certificate(str(Path(directory) / "server.key_secret"))
    if secret is None:
        raise ValueError(f"{directory}/server.key_secret holds no secret key")
    return CurveServer(public, secret)


def load_client(directory: str | os.PathLike[str]) -> CurveClient:
    root = Path(directory)
    public, secret = zmq.auth.load_certificate(str(root / "client.key_secret"))
    server_public, _ = zmq.auth.load_certificate(str(root / "server.key"))
    if secret is None:
        raise ValueError(f"{directory}/client.key_secret holds no secret key")
    return CurveClient(public, secret, server_public)


class LoggingAuthenticator(ThreadAuthenticator):
    """ThreadAuthenticator that logs every refused handshake at WARNING and counts them."""

    denied = 0

    def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):  # type: ignore[override]
        if status_code != b"200":
            LoggingAuthenticator.denied += 1
            log.warning("ZAP DENIED: %s %s", status_code.decode(errors="replace"), status_text.decode(errors="replace"))
        super()._send_zap_reply(request_id, status_code, status_text, user_id)


def start_authenticator(context: zmq.Context, directory: str | os.PathLike[str]) -> LoggingAuthenticator:
    """Admit only the client public keys in DIR/authorized_clients (call before binding)."""
    auth = LoggingAuthenticator(context)
    auth.start()
    auth.configure_curve(domain="*", location=str(Path(directory) / AUTHORIZED))
    return auth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.keys", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="keys", help="where to write the keys (default: keys/)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing keys")
    args = parser.parse_args(argv)
    try:
        root = generate(args.dir, overwrite=args.overwrite)
    except FileExistsError as exc:
        print(f"error: {exc}")
        return 1
    print(f"CURVE keys written to {root}: head uses server.key_secret + {AUTHORIZED}/, "
          f"collectors use client.key_secret + server.key")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
