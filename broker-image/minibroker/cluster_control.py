"""The control socket of ``minibroker cluster``: how ``minibroker cluster status`` and
``minibroker cluster restart NODE`` reach the running launcher.

The launcher listens on ``DATA_DIR/cluster.sock``, a Unix socket made with mode 0600 (as
``controller.secret`` next to it: only the user who runs the cluster may restart its
nodes). A request is one line (``status``, ``restart NODE``); the answer is one JSON line,
``{"ok": bool, "text": str}``, the text being what the command prints. A client can make the
launcher hold one request of at most ``MAX_REQUEST_BYTES`` for at most
``REQUEST_TIMEOUT_S``: the launcher answers between its checks of the nodes, so a slow
client must not delay the report of a node's exit for longer than that.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

SOCKET_FILE = "cluster.sock"
MAX_REQUEST_BYTES = 256
REQUEST_TIMEOUT_S = 1.0
UNIX_PATH_MAX = 107  # sun_path is 108 bytes on Linux, one of them the terminating NUL


class ControlError(Exception):
    """No launcher answers on the data dir, or the socket cannot be made; the message
    says which and where."""


class AlreadyRunning(ControlError):
    """A launcher answers on the data dir already."""


def socket_path(data_dir: Path) -> Path:
    return data_dir / SOCKET_FILE


def listen(data_dir: Path) -> socket.socket:
    """Listen on ``DATA_DIR/cluster.sock``. A launcher already answering there is an error
    (two launchers on one data dir would run two brokers on one log); a socket file that
    nobody answers on was left by a launcher that was SIGKILLed, and is replaced."""
    path = socket_path(data_dir)
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise ControlError(f"{path} is longer than a Unix socket path may be "
                           f"({UNIX_PATH_MAX} bytes)")
    try:
        ask(data_dir, "status")
    except ControlError:
        path.unlink(missing_ok=True)
    else:
        raise AlreadyRunning(f"another minibroker cluster runs on {data_dir} "
                           f"(`minibroker cluster status --data-dir {data_dir}` lists it)")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        server.bind(os.fsencode(path))
    finally:
        os.umask(umask)
    server.listen(8)
    server.setblocking(False)
    return server


def read_request(conn: socket.socket) -> str:
    """One request line; ``ControlError`` if it is longer than ``MAX_REQUEST_BYTES`` or
    does not end within ``REQUEST_TIMEOUT_S``."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = conn.recv(MAX_REQUEST_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REQUEST_BYTES:
                raise ControlError(f"a request is at most {MAX_REQUEST_BYTES} bytes")
    except TimeoutError as exc:
        raise ControlError(f"no request line within {REQUEST_TIMEOUT_S} s") from exc
    return data.decode(errors="replace").strip()


def answer(conn: socket.socket, ok: bool, text: str) -> None:
    with contextlib.suppress(OSError):  # the client went away: nothing to tell it
        conn.sendall(json.dumps({"ok": ok, "text": text}).encode() + b"\n")


def ask(data_dir: Path, request: str) -> tuple[bool, str]:
    """Send one request to the launcher running on ``data_dir``: (ok, text)."""
    path = socket_path(data_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        try:
            client.connect(os.fsencode(path))
            client.sendall(request.encode() + b"\n")
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ControlError(f"no minibroker cluster runs on {data_dir} "
                               f"(nothing answers on {path})") from exc
        except OSError as exc:
            raise ControlError(f"the minibroker cluster on {data_dir} did not answer: "
                               f"{exc}") from exc
    try:
        message = json.loads(reply)
        return bool(message["ok"]), str(message["text"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ControlError(f"the minibroker cluster on {data_dir} answered "
                           f"{reply[:200]!r}") from exc
