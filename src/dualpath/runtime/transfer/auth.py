"""ZeroMQ CURVE authentication of the control and data planes (libsodium inside libzmq; no
hand-written crypto).

One cluster keypair is made at start (``ClusterKeys.generate``) and written to a 0600 key file
that every member reads (``LocalCluster`` passes its path to the processes it starts; ``dualpath
engine --key-file`` on other hosts). Every socket that binds (the scheduler's ROUTER, each
transport's PULL) is a CURVE server with the cluster key; every socket that connects is a CURVE
client presenting the cluster keypair. A ZAP handler on each binding context (``Gatekeeper``)
admits only clients whose public key is the cluster's, which the CURVE handshake proves they hold
the secret of: a peer without the key file cannot connect, so nothing it sends is ever decoded.
Each failed handshake (no key, another key, no CURVE at all) is counted as
``<plane>/unauthenticated`` in the process's DropCounter, from the binding socket's monitor.
Traffic is encrypted as a side effect.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth.thread

from dualpath.core.errors import ConfigError
from dualpath.runtime.transfer.drops import DropCounter


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterKeys:
    """The cluster's CURVE keypair (Z85 text, 40 characters each)."""

    public: bytes
    secret: bytes

    @classmethod
    def generate(cls) -> ClusterKeys:
        public, secret = zmq.curve_keypair()
        return cls(public=public, secret=secret)

    def write(self, path: str | Path) -> Path:
        """Write a key file readable by its owner only (0600); returns the path."""
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"public": self.public.decode(), "secret": self.secret.decode()}, f)
        os.chmod(path, 0o600)
        return path

    @classmethod
    def read(cls, path: str | Path) -> ClusterKeys:
        try:
            data = json.loads(Path(path).read_text())
            keys = cls(public=data["public"].encode(), secret=data["secret"].encode())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError("key_file", str(path), f"not a dualpath cluster key file: {exc}") from None
        if len(keys.public) != 40 or len(keys.secret) != 40:
            raise ConfigError("key_file", str(path), "keys must be 40-character Z85 CURVE keys")
        return keys

    def server(self, sock: zmq.Socket) -> zmq.Socket:
        """Make ``sock`` (before bind) a CURVE server of the cluster."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True
        sock.zap_domain = b"dualpath"
        return sock

    def client(self, sock: zmq.Socket) -> zmq.Socket:
        """Make ``sock`` (before connect) a CURVE client presenting the cluster keypair."""
        sock.curve_serverkey = self.public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        return sock


def load_keys(key_file: str) -> ClusterKeys | None:
    """The keys of ``key_file``; None for "" (an unauthenticated cluster)."""
    return ClusterKeys.read(key_file) if key_file else None


HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class Gatekeeper:
    """The ZAP handler of one context (admits the cluster key only) and the handshake monitors of
    its binding sockets (each failed handshake: a peer without the key, or without CURVE, counted
    as ``<plane>/unauthenticated``)."""

    def __init__(self, ctx: zmq.Context, keys: ClusterKeys) -> None:
        self.keys = keys
        self._auth = zmq.auth.thread.ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="dualpath", credentials_provider=self)
        self._monitored: list[tuple[zmq.Socket, zmq.Socket]] = []

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP: whether the client with Z85 public key ``key`` may connect."""
        return key == self.keys.public

    def monitor(self, sock: zmq.Socket) -> zmq.Socket:
        """A socket delivering ``sock``'s failed handshakes (poll it, then ``count``)."""
        mon = sock.get_monitor_socket(HANDSHAKE_FAILED)
        self._monitored.append((sock, mon))
        return mon

    @staticmethod
    def count(mon: zmq.Socket, drops: DropCounter, plane: str) -> None:
        """Count the failed handshakes waiting on monitor socket ``mon`` (never blocks)."""
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            drops.drop(
                plane,
                "unauthenticated",
                f"a peer failed the CURVE handshake (event {event['event']}, {event.get('endpoint', b'')!r})",
            )

    def stop(self) -> None:
        for sock, mon in self._monitored:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            mon.close(0)
        self._monitored.clear()
        self._auth.stop()
