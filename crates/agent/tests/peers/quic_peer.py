"""A QUIC peer that is not quicsdn: aioquic, connecting to a controller agent
the way a foreign or hostile client would. The agent must refuse or close
each case and log why (crates/agent/tests/foreign_peers.rs).

    quic_peer.py --port P --ca CA [--cert C --key K] [--alpn A] CASE

CASE: handshake (connect, then wait for the agent to close or not) or garbage
(after the handshake, open streams that no quicsdn agent would send and
report what the agent answered on each). Prints one JSON object.
"""

import argparse
import asyncio
import json
import os

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
)


def varint(v):
    # RFC 9000 §16
    if v < 1 << 6:
        return bytes([v])
    if v < 1 << 14:
        return (v | 0x4000).to_bytes(2, "big")
    if v < 1 << 30:
        return (v | 0x80000000).to_bytes(4, "big")
    return (v | 0xC000000000000000).to_bytes(8, "big")


def session_preamble(session, service, mode=(0, 0)):
    # crates/wire/src/preamble.rs: 0x71, session, mode code, mode parameter, name.
    name = service.encode()
    return b"\x71" + varint(session) + varint(mode[0]) + varint(mode[1]) + varint(len(name)) + name


# The first bytes of the streams a quicsdn agent opens (wire::preamble).
STREAM_MAGICS = {0x63, 0x71, 0x75}


def junk_bytes(n):
    """Random bytes that cannot start a quicsdn stream. Fully random junk starts
    with a stream type about once in 85 streams, and may then declare a preamble
    longer than what follows: the agent rightly waits for the rest (up to its
    10 s preamble timeout), and the stream would stay unanswered for as long as
    this client waits. Those streams are tested on purpose above (bad_hello)."""
    first = os.urandom(1)[0]
    while first in STREAM_MAGICS:
        first = os.urandom(1)[0]
    return bytes([first]) + os.urandom(n - 1)


class Peer(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handshake = False
        self.terminated = None
        self.done = asyncio.Event()
        self.streams = {}

    def stream(self, sid):
        return self.streams.setdefault(sid, {"stop_sending": None, "reset": None, "data": 0})

    def quic_event_received(self, event):
        super().quic_event_received(event)
        if isinstance(event, HandshakeCompleted):
            self.handshake = True
        elif isinstance(event, ConnectionTerminated):
            self.terminated = {"error_code": event.error_code, "reason": event.reason_phrase}
            self.done.set()
        elif isinstance(event, StopSendingReceived):
            self.stream(event.stream_id)["stop_sending"] = event.error_code
        elif isinstance(event, StreamReset):
            self.stream(event.stream_id)["reset"] = event.error_code
        elif isinstance(event, StreamDataReceived):
            self.stream(event.stream_id)["data"] += len(event.data)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--alpn", default="quicsdn/1")
    p.add_argument("--server-name", default="ctl")
    p.add_argument("--streams", type=int, default=200, help="garbage: how many junk streams")
    p.add_argument("case", choices=["handshake", "garbage"])
    a = p.parse_args()

    cfg = QuicConfiguration(is_client=True, alpn_protocols=[a.alpn], server_name=a.server_name)
    cfg.load_verify_locations(a.ca)
    if a.cert:
        cfg.load_cert_chain(a.cert, a.key)
    out = {"handshake": False, "terminated": None, "streams": {}}
    peers = []

    def make(*args, **kwargs):
        peers.append(Peer(*args, **kwargs))
        return peers[-1]

    try:
        async with connect("127.0.0.1", a.port, configuration=cfg, create_protocol=make) as peer:
            out["handshake"] = peer.handshake
            q = peer._quic
            if a.case == "garbage" and peer.handshake:
                kinds = {}

                def send(data, uni=False, end=True):
                    sid = q.get_next_available_stream_id(is_unidirectional=uni)
                    q.send_stream_data(sid, data, end_stream=end)
                    return sid

                kinds["http"] = send(b"GET / HTTP/1.1\r\nHost: ctl\r\n\r\n")
                kinds["unknown_service"] = send(session_preamble(0, "telnet"), end=False)
                kinds["bad_hello"] = send(b"\x63\x05{oops", end=False)
                # (left open: aioquic reports no STOP_SENDING on a stream it has finished)
                kinds["uni_junk"] = send(os.urandom(512), uni=True, end=False)
                # A real session, then a message no OpenFlow peer sends: a
                # header declaring 2 bytes.
                kinds["malformed_openflow"] = send(
                    session_preamble(1, "openflow") + b"\x04\x00\x00\x02\x00\x00\x00\x07", end=False
                )
                junk = [send(junk_bytes(4096), end=False) for _ in range(a.streams)]
                peer.transmit()
                # Wait until the agent has answered every stream, or closed.
                for _ in range(200):
                    if peer.terminated or all(s in peer.streams for s in list(kinds.values()) + junk):
                        break
                    await asyncio.sleep(0.05)
                out["streams"] = {k: peer.streams.get(s) for k, s in kinds.items()}
                codes = {}
                for s in junk:
                    st = peer.streams.get(s) or {}
                    code = str(st.get("stop_sending"))
                    codes[code] = codes.get(code, 0) + 1
                out["junk_stop_sending"] = codes
            else:
                try:
                    await asyncio.wait_for(peer.done.wait(), 5)
                except asyncio.TimeoutError:
                    pass
            out["terminated"] = peer.terminated
    except ConnectionError as e:
        # The handshake failed: what the agent said, if it said anything.
        out["error"] = str(e) or type(e).__name__
        if peers:
            out["handshake"] = peers[0].handshake
            out["terminated"] = peers[0].terminated
    print(json.dumps(out), flush=True)


asyncio.run(main())
