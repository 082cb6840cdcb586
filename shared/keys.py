"""CURVE keys: generation (`python -m shared.keys --dir DIR [--client NAME ...]`, used by `make keys`) and loading.

Layout of DIR (mode 0700; every *.key_secret is created 0600, never chmodded afterwards):
server.key / server.key_secret (the head); authorized_clients/ holding the public keys the head
accepts; and the collectors' key pairs, either one pair shared by every collector machine
(client.key / client.key_secret, what `--dir` alone writes) or one pair per machine
(clients/NAME.key / clients/NAME.key_secret, written by `--client NAME`, its public key copied to
authorized_clients/NAME.key). Loaders refuse a secret key file that group or others may access.

Every head socket is a CURVE server; a ZAP authenticator admits only keys in authorized_clients/
(plus public keys the head admits at run time: the Ray launcher's per-actor keys, see `AllowList`)
and logs each refusal ("ZAP DENIED") so a misconfigured collector is visible at the head. The
directory is consulted at every handshake, so deleting authorized_clients/NAME.key refuses that
machine's next connection without restarting the head (connections already made stay up).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from shared.config import ConfigError

log = logging.getLogger(__name__)
AUTHORIZED = "authorized_clients"
CLIENTS = "clients"
SECRET_SUFFIX = ".key_secret"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


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


def _certificate(public: bytes, secret: bytes | None) -> bytes:
    """The text of a certificate file as pyzmq writes it (zmq.auth.load_certificate reads it)."""
    kind = "**Secret** Certificate" if secret else "Public Certificate"
    lines = [f"#   ****  Generated on {datetime.datetime.now()} by mario-apex  ****", f"#   ZeroMQ CURVE {kind}",
             "", "metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return ("\n".join(lines) + "\n").encode()


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write `path` atomically, created with `mode` (a fresh file: the mode holds from its first byte)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _private_dir(path: Path) -> None:
    """`path` exists with mode 0700 (created so; an existing directory is closed first)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if _mode(path) != 0o700:
        os.chmod(path, 0o700)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def _key_pair(directory: Path, name: str) -> bytes:
    """directory/name.key (0644) and directory/name.key_secret (0600); returns the public key."""
    public, secret = zmq.curve_keypair()
    _write(directory / f"{name}{SECRET_SUFFIX}", _certificate(public, secret), 0o600)
    _write(directory / f"{name}.key", _certificate(public, None), 0o644)
    return public


def check_client_name(name: str) -> str:
    """A machine name usable as a file name: ConfigError (one line) otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"--client {name!r} is invalid: allowed 1-64 letters, digits, '_', '.', '-', "
                          f"starting with a letter or digit")
    return name


def generate(directory: str | os.PathLike[str], overwrite: bool = False, clients: list[str] | None = None) -> Path:
    """Create the keys directory (mode 0700; secret files 0600 from their creation).

    Without `clients`: the head's pair, one collector pair shared by every machine (client.key*) and
    authorized_clients/client.key. With `clients`: one pair per named machine under clients/, each
    public key authorized as authorized_clients/NAME.key; the head's pair is made only if DIR has none,
    so machines can be added later. FileExistsError for keys that exist unless `overwrite`;
    ConfigError for a name that is not a plain file name.
    """
    root = Path(directory)
    names = [check_client_name(n) for n in clients or []]
    if len(set(names)) != len(names):
        raise ConfigError(f"--client names repeat: {', '.join(sorted(n for n in set(names) if names.count(n) > 1))}")
    has_server = (root / f"server{SECRET_SUFFIX}").exists()
    if not names and has_server and not overwrite:
        raise FileExistsError(f"{root} already holds keys (pass --overwrite to replace them)")
    for name in names:
        for existing in (root / CLIENTS / f"{name}{SECRET_SUFFIX}", root / AUTHORIZED / f"{name}.key"):
            if existing.exists() and not overwrite:
                raise FileExistsError(f"{existing} already exists: machine {name!r} has keys "
                                      f"(pass --overwrite to replace them)")
    _private_dir(root)
    auth = root / AUTHORIZED
    _private_dir(auth)
    if not has_server or not names:  # adding machines keeps the head's pair
        _key_pair(root, "server")
    if not names:
        _write(auth / "client.key", _certificate(_key_pair(root, "client"), None), 0o644)
        return root
    _private_dir(root / CLIENTS)
    for name in names:
        _write(auth / f"{name}.key", _certificate(_key_pair(root / CLIENTS, name), None), 0o644)
    return root


SERVER_FILES = (f"server{SECRET_SUFFIX}",)  # plus at least one AUTHORIZED/*.key


def client_files(name: str | None = None) -> tuple[str, ...]:
    """What a collector loads: the shared pair's secret, or machine `name`'s, plus the head's public key."""
    secret = f"client{SECRET_SUFFIX}" if name is None else f"{CLIENTS}/{check_client_name(name)}{SECRET_SUFFIX}"
    return secret, "server.key"


CLIENT_FILES = client_files()


def check_keys_dir(directory: str | os.PathLike[str], role: str = "server", client: str | None = None) -> Path:
    """Raise ConfigError (one line) unless DIR holds the files `role` ("server": the head, "client": a collector,
    `client` naming its machine's pair) loads.

    `make keys` writes all of them; a ConfigError is a ValueError, as before for unreadable keys.
    """
    root = Path(directory)
    remedy = (f"`make keys KEYS_DIR={root}` (python -m shared.keys --dir {root}"
              f"{'' if client is None else f' --client {client}'}) writes them")
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise ConfigError(f"--curve-keys {root} {what}; {remedy}")
    needed = SERVER_FILES if role == "server" else client_files(client)
    missing = [name for name in needed if not (root / name).is_file()]
    if role == "server":
        auth = root / AUTHORIZED
        if not auth.is_dir() or not any(auth.glob("*.key")):
            missing.append(f"{AUTHORIZED}/*.key (the public keys of the collectors the head admits)")
    if missing:
        raise ConfigError(f"--curve-keys {root} lacks {', '.join(missing)}; {remedy}")
    return root


def check_secret_mode(path: Path) -> None:
    """ConfigError (one line) when group or others have any access to the secret key file `path`."""
    mode = _mode(path)
    if mode & 0o077:
        raise ConfigError(f"--curve-keys {path.parent}: {path} has mode 0{mode:o}: group or others may read this "
                          f"secret key; allowed 0600 or 0400 (chmod 600 {path})")


def _load(path: Path, want_secret: bool) -> tuple[bytes, bytes | None]:
    if want_secret and path.is_file():
        check_secret_mode(path)
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--curve-keys {path.parent}: {path.name} is not a readable CURVE certificate "
                          f"({' '.join(str(exc).split())})") from exc
    if want_secret and secret is None:
        raise ConfigError(f"--curve-keys {path.parent}: {path.name} holds no secret key")
    return public, secret


def load_server(directory: str | os.PathLike[str]) -> CurveServer:
    """The head's key pair; ConfigError (one line) for a missing, incomplete, exposed or unreadable keys dir."""
    root = check_keys_dir(directory, "server")
    public, secret = _load(root / SERVER_FILES[0], want_secret=True)
    return CurveServer(public, secret)


def load_client(directory: str | os.PathLike[str], name: str | None = None) -> CurveClient:
    """A collector's key pair (the shared one, or machine `name`'s from clients/) plus the head's public key;
    ConfigError (one line) as for load_server."""
    root = check_keys_dir(directory, "client", name)
    secret_file, server_file = client_files(name)
    public, secret = _load(root / secret_file, want_secret=True)
    server_public, _ = _load(root / server_file, want_secret=False)
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
    """The client public keys the head admits: DIR/authorized_clients, as it is at each handshake, plus
    keys added at run time.

    The directory is re-read whenever its listing or any file's size, inode or mtime changed since the
    last handshake (one scandir per handshake otherwise), so deleting NAME.key refuses that machine's
    next connection and adding one admits it, with the head running. A file that cannot be parsed
    admits nothing (logged); a missing directory admits no file key at all.

    Run-time keys are public keys whose secrets were made where they are used (the Ray launcher's
    per-actor key pairs); `add`/`discard` are called from the head's thread, `callback` from the ZAP
    thread on every handshake (pyzmq's credentials-provider interface)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = Path(directory) / AUTHORIZED
        self._seen: tuple | None = None
        self._files: dict[bytes, str] = {}  # public key -> file name
        self._added: set[bytes] = set()
        self._lock = threading.Lock()
        self._refresh()

    def _listing(self) -> tuple:
        try:
            with os.scandir(self._dir) as entries:
                return tuple(sorted((e.name, e.inode(), e.stat().st_size, e.stat().st_mtime_ns)
                                    for e in entries if e.name.endswith(".key") and e.is_file()))
        except OSError:
            return ()

    def _refresh(self) -> None:
        listing = self._listing()
        if listing == self._seen:
            return
        files: dict[bytes, str] = {}
        for name, *_ in listing:
            try:
                public, _secret = zmq.auth.load_certificate(str(self._dir / name))
            except (OSError, ValueError) as exc:
                log.warning("%s: not a CURVE public key, admits nobody (%s)", self._dir / name, exc)
                continue
            files[public] = name
        if self._seen is not None and files != self._files:
            gone = sorted(set(self._files.values()) - set(files.values()))
            log.info("%s: %d keys admitted%s", self._dir, len(files),
                     f" ({', '.join(gone)} no longer)" if gone else "")
        self._seen, self._files = listing, files

    def add(self, public_z85: str) -> None:
        with self._lock:
            self._added.add(public_z85.encode())

    def discard(self, public_z85: str) -> None:
        with self._lock:
            self._added.discard(public_z85.encode())

    def callback(self, domain: str, key: bytes) -> bool:
        with self._lock:
            self._refresh()
            return key in self._files or key in self._added


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
    parser.add_argument("--client", dest="clients", action="extend", nargs="+", default=[], metavar="NAME",
                        help="issue a key pair for this collector machine (repeatable; also NAME,NAME): "
                             f"DIR/{CLIENTS}/NAME.key_secret for the machine, DIR/{AUTHORIZED}/NAME.key for the head; "
                             f"the machine is revoked by deleting DIR/{AUTHORIZED}/NAME.key")
    parser.add_argument("--overwrite", action="store_true", help="replace existing keys")
    args = parser.parse_args(argv)
    clients = [name for item in args.clients for name in item.split(",")] if args.clients else []
    try:
        root = generate(args.dir, overwrite=args.overwrite, clients=clients)
    except FileExistsError as exc:  # status 1, as always: keys are never replaced silently
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if clients:
        print(f"CURVE keys written to {root}: head uses server.key_secret + {AUTHORIZED}/; machine NAME uses "
              f"{CLIENTS}/NAME.key_secret + server.key (python -m actors --curve-keys DIR --curve-client NAME) "
              f"for {', '.join(clients)}")
    else:
        print(f"CURVE keys written to {root}: head uses server.key_secret + {AUTHORIZED}/, "
              f"collectors use client.key_secret + server.key")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
