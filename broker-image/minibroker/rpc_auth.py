"""Authentication on the controller channel: a challenge-response over a per-cluster secret.

Kafka's controller listener (``controller.listener.names``, KIP-631; KIP-500's quorum) is a
listener like any other: it takes SASL or mTLS, and only brokers and controllers holding the
inter-broker credentials may register, heartbeat or change an ISR. minibroker's controller
channel does the same with the shape of SASL/SCRAM (RFC 5802, KIP-84), without the salted
password: the secret is a random 256-bit key, so SCRAM's PBKDF2 iterations would add
nothing. On every new connection::

    server -> client  {"challenge": {"mechanism": "HMAC-SHA256", "nonce": SN}}
    client -> server  {"id": 0, "method": "authenticate",
                       "params": {"mechanism": "HMAC-SHA256", "nonce": CN,
                                  "proof": HMAC-SHA256(K, "client" SN CN)}}
    server -> client  {"id": 0, "result": {"proof": HMAC-SHA256(K, "server" SN CN)}}
                      or an error, and the connection is closed

The secret never crosses the wire. The server's nonce makes a recorded client proof worth
nothing on another connection; the client's nonce does the same for the server's proof,
which the client checks before it sends anything else (SCRAM's ServerSignature): a stand-in
controller that does not hold the secret cannot feed brokers metadata. Proofs are compared
with ``hmac.compare_digest``. Like Kafka's SASL_PLAINTEXT, what follows the handshake is
neither encrypted nor signed: the handshake keeps out whoever does not hold the secret, and
the operator's NetworkPolicy keeps other pods off the port.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from minibroker import environment

MECHANISM = "HMAC-SHA256"
AUTHENTICATE = "authenticate"
"""The method of the client's proof (Kafka's SaslAuthenticate)."""
CLIENT, SERVER = "client", "server"
"""Which side a proof is from: one side's proof never passes for the other's."""

SECRET_ENV = "MINIBROKER_CONTROLLER_SECRET"
SECRET_FILE_ENV = "MINIBROKER_CONTROLLER_SECRET_FILE"
SECRET_BYTES = 32
"""What ``new_secret`` draws: 256 bits, written as 64 hex digits."""
MIN_SECRET_LENGTH = 32
"""The shortest secret accepted (128 bits as hex): anything shorter is refused at start."""

_NONCE = re.compile(r"[0-9a-f]{32,128}")


class AuthenticationError(Exception):
    """No usable secret, or a peer that failed the handshake."""


def new_secret() -> str:
    """A fresh cluster secret: what the operator puts in the cluster's Secret and the local
    platform in its run directory."""
    return secrets.token_hex(SECRET_BYTES)


def write_secret_file(path: Path) -> Path:
    """Create ``path`` holding a new secret, readable by its owner only (0600 from the
    start: the file never exists with wider permissions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(new_secret() + "\n")
    return path


def load_secret(path: Path | None = None, env: Mapping[str, str] = os.environ) -> bytes:
    """The controller secret: from ``path``, else ``$MINIBROKER_CONTROLLER_SECRET_FILE``,
    else ``$MINIBROKER_CONTROLLER_SECRET`` (Kubernetes sets it from the cluster's Secret).
    Never from the command line, where ``ps`` shows it. ``AuthenticationError`` naming
    where it looked when there is none, or one too short to be a key."""
    if path is None and env.get(SECRET_FILE_ENV):
        path = Path(env[SECRET_FILE_ENV])
    if path is not None:
        try:
            text, source = path.read_text().strip(), str(path)
        except OSError as exc:
            raise AuthenticationError(f"cannot read the controller secret: {exc}") from None
    else:
        text, source = env.get(SECRET_ENV, "").strip(), f"${SECRET_ENV}"
    if not text:
        raise AuthenticationError(
            f"no controller secret: give --controller-secret-file, ${SECRET_FILE_ENV} or "
            f"${SECRET_ENV} (the controller channel refuses unauthenticated peers)")
    if len(text) < MIN_SECRET_LENGTH:
        raise AuthenticationError(f"the controller secret from {source} has {len(text)} "
                                  f"characters; at least {MIN_SECRET_LENGTH}")
    return text.encode()


def new_nonce() -> str:
    return environment.token_hex(16)


def valid_nonce(value: object) -> bool:
    return isinstance(value, str) and _NONCE.fullmatch(value) is not None


def proof(secret: bytes, side: str, server_nonce: str, client_nonce: str) -> str:
    """HMAC-SHA256 of both nonces under the secret, labelled with the side that sends it."""
    message = "\n".join((MECHANISM, side, server_nonce, client_nonce)).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify(secret: bytes, side: str, server_nonce: str, client_nonce: str,
           offered: object) -> bool:
    """Whether ``offered`` is ``side``'s proof, in constant time."""
    if not isinstance(offered, str):
        return False
    expected = proof(secret, side, server_nonce, client_nonce)
    return hmac.compare_digest(expected.encode(), offered.encode("utf-8", "replace"))
