"""A Python speaker of tessel's rendezvous-store protocol (see
core/comm/store_protocol.h), for tests that attack or probe a live store.
Written from the protocol description, independently of the C++ client."""
import hashlib
import hmac
import os
import socket
import struct

SERVER_HELLO = b"TSLSTOR2"
CLIENT_HELLO = b"TSLCLNT2"
PROOF = b"TSLOKAY2"
DENY = b"TSLDENY2"
SET, GET, ADD, CHECK, WAIT = 1, 2, 3, 4, 5


def _mac(label, secret, server_nonce, client_nonce, rank):
    msg = label + server_nonce + client_nonce + struct.pack("<i", rank)
    return hmac.new(secret.encode(), msg, hashlib.sha256).digest()


def _read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def _blob(b):
    return struct.pack("<I", len(b)) + b


class StoreClient:
    """connect(secret) authenticates; secret=None skips the handshake."""

    def __init__(self, port, host="127.0.0.1", timeout=5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        hello = _read_exact(self.sock, 40)
        assert hello[:8] == SERVER_HELLO, hello
        self.server_nonce = hello[8:]

    def authenticate(self, secret, rank=99):
        client_nonce = os.urandom(32)
        mac = _mac(b"tessel-store-client", secret, self.server_nonce, client_nonce, rank)
        self.sock.sendall(CLIENT_HELLO + struct.pack("<i", rank) + client_nonce + mac)
        head = _read_exact(self.sock, 8)
        if head == DENY:
            return False
        assert head == PROOF, head
        proof = _read_exact(self.sock, 32)
        assert hmac.compare_digest(proof, _mac(b"tessel-store-server", secret, self.server_nonce, client_nonce, rank))
        return True

    def request(self, body):
        self.sock.sendall(struct.pack("<I", len(body)) + body)
        (length,) = struct.unpack("<I", _read_exact(self.sock, 4))
        reply = _read_exact(self.sock, length)
        return reply[0], reply[1:]

    def get(self, key, wait_ms=0):
        return self.request(bytes([GET]) + _blob(key.encode()) + struct.pack("<I", wait_ms))

    def set(self, key, value):
        return self.request(bytes([SET]) + _blob(key.encode()) + _blob(value))

    def close(self):
        self.sock.close()
