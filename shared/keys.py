"""CURVE keys: generation (`python -m shared.keys --dir DIR`, used by `make keys`) and loading.

Layout of DIR: server.key / server.key_secret (the head), client.key / client.key_secret (the
collectors), and authorized_clients/ holding the public keys the head accepts. Every head
socket is a CURVE server; a ZAP authenticator admits only keys in authorized_clients/ (plus
public keys the head admits at run time: the Ray launcher's per-actor keys, see `AllowList`) and
logs each refusal ("ZAP DENIED") so a misconfigured collector is visible at the head.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from shared.config import ConfigError

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


SERVER_FILES = ("server.key_secret",)  # plus at least one AUTHORIZED/*.key
CLIENT_FILES = ("client.key_secret", "server.key")


def check_keys_dir(directory: str | os.PathLike[str], role: str = "server") -> Path:
    """Raise ConfigError (one line) unless DIR holds the files `role` ("server": the head, "client": a collector) loads.

    `make keys` writes all of them; a ConfigError is a ValueError, as before for unreadable keys.
    """
    root = Path(directory)
    remedy = f"`make keys KEYS_DIR={root}` (python -m shared.keys --dir {root}) writes them"
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise ConfigError(f"--curve-keys {root} {what}; {remedy}")
    needed = SERVER_FILES if role == "server" else CLIENT_FILES
    missing = [name for name in needed if not (root / name).is_file()]
    if role == "server":
        auth = root / AUTHORIZED
        if not auth.is_dir() or not any(auth.glob("*.key")):
            missing.append(f"{AUTHORIZED}/*.key (the public keys of the collectors the head admits)")
    if missing:
        raise ConfigError(f"--curve-keys {root} lacks {', '.join(missing)}; {remedy}")
    return root


def _load(path: Path, want_secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--curve-keys {path.parent}: {path.name} is not a readable CURVE certificate "
                          f"({' '.join(str(exc).split())})") from exc
    if want_secret and secret is None:
        raise ConfigError(f"--curve-keys {path.parent}: {path.name} holds no secret key")
    return public, secret


def load_server(directory: str | os.PathLike[str]) -> CurveServer:
    """The head's key pair; ConfigError (one line) for a missing, incomplete or unreadable keys dir."""
    root = check_keys_dir(directory, "server")
    public, secret = _load(root / "server.key_secret", want_secret=True)
    return CurveServer(public, secret)


def load_client(directory: str | os.PathLike[str]) -> CurveClient:
    """A collector's key pair plus the head's public key; ConfigError (one line) as for load_server."""
    root = check_keys_dir(directory, "client")
    public, secret = _load(root / "client.key_secret", want_secret=True)
    server_public, _ = _load(root / "server.key", want_secret=False)
    return CurveClient(public, secret, server_public)


class LoggingAuthenticator(ThreadAuthenticator):
    """ThreadAuthenticator that logs every refused handshake at WARNING and counts them."""

    denied = 0

    def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):  # type: ignore[override]
        if status_code != b"200":
            LoggingAuthenticator.denied += 1
            log.warning("ZAP DENIED: %s %s", status_code.decode(errors="replace"), status_text.decode(errors="replace"))
        super()._send_zap_reply(request_id, status_code, status_text, user_id)


class AllowList:
    """The client public keys the head admits: DIR/authorized_clients (read once) plus keys added at run time.

    Run-time keys are public keys whose secrets were made where they are used (the Ray launcher's
    per-actor key pairs); `add`/`discard` are called from the head's thread, `callback` from the ZAP
    thread on every handshake (pyzmq's credentials-provider interface)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._fixed = frozenset(zmq.auth.load_certificates(str(Path(directory) / AUTHORIZED)))
        self._added: set[bytes] = set()
        self._lock = threading.Lock()

    def add(self, public_z85: str) -> None:
        with self._lock:
            self._added.add(public_z85.encode())

    def discard(self, public_z85: str) -> None:
        with self._lock:
            self._added.discard(public_z85.encode())

    def callback(self, domain: str, key: bytes) -> bool:
        with self._lock:
            return key in self._fixed or key in self._added


def start_authenticator(context: zmq.Context, directory: str | os.PathLike[str],
                        allow: AllowList | None = None) -> LoggingAuthenticator:
    """Admit only the client public keys in `allow` (default: DIR/authorized_clients) (call before binding)."""
    auth = LoggingAuthenticator(context)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=allow or AllowList(directory))
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
