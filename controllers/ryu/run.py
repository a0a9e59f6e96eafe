#!/usr/bin/env python3
"""Launch Ryu 4.34 with the lab's L2 learning app (or other apps).

Same options as controllers/osken/run.py:

    run.py [--listen-host IP] [--port N]
           [--tls-key KEY --tls-cert CERT --tls-ca CA]
           [--verbose] [APP ...]

With the three --tls-* options Ryu listens for OpenFlow over TLS on --port
(and opens no plain TCP listener) and requires a client certificate signed
by CA. APP is a module name or a .py path; default: ../l2_learning.py
(shared with the other controller).
"""

import argparse
import os
import sys

# Ryu 4.34 predates eventlet 0.33's removal of wsgi.ALREADY_HANDLED, which
# ryu.app.wsgi reads at import time; an opaque sentinel is all it needs.
import eventlet.wsgi

if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
    eventlet.wsgi.ALREADY_HANDLED = object()

from ryu.lib import hub  # noqa: E402  (monkey-patches with eventlet)
from ryu.cmd import manager  # noqa: E402

import ssl  # noqa: E402  (after eventlet's patching, like Ryu's own modules)


def _fix_tls_server():
    """Make Ryu 4.34's TLS listener accept more than one connection.

    Ryu 4.34's StreamServer pops the certificate, key and SSLContext out of
    its shared ssl_args inside the per-connection handler, so the first
    switch connects and every later connection (other switches, reconnects)
    dies with "certfile must be specified for server-side operations". This
    builds the context once, in the constructor: the fix os-ken carries in
    its own os_ken.lib.hub.StreamServer. Plain TCP listeners are untouched.
    """
    original = hub.StreamServer.__init__

    def __init__(self, listen_info, handle=None, backlog=None, spawn="default", **ssl_args):
        original(self, listen_info, handle, backlog, spawn)
        if not ssl_args:
            return
        ctx = ssl_args.pop("ssl_ctx", None) or ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(ssl_args.pop("certfile"), ssl_args.pop("keyfile"))
        if "cert_reqs" in ssl_args:
            ctx.verify_mode = ssl_args.pop("cert_reqs")
        if "ca_certs" in ssl_args:
            ctx.load_verify_locations(ssl_args.pop("ca_certs"))
        ssl_args.pop("ssl_version", None)
        ssl_args.setdefault("server_side", True)

        def wrap_and_handle(sock, addr):
            handle(ctx.wrap_socket(sock, **ssl_args), addr)

        self.handle = wrap_and_handle

    hub.StreamServer.__init__ = __init__

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen-host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=6653)
    p.add_argument("--tls-key")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-ca")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("apps", nargs="*", default=[os.path.join(HERE, "..", "l2_learning.py")])
    a = p.parse_args()

    tls = [a.tls_key, a.tls_cert, a.tls_ca]
    if any(tls) and not all(tls):
        p.error("--tls-key, --tls-cert and --tls-ca go together")

    args = ["--ofp-listen-host", a.listen_host]
    if all(tls):
        args += ["--ofp-ssl-listen-port", str(a.port),
                 "--ctl-privkey", a.tls_key, "--ctl-cert", a.tls_cert,
                 "--ca-certs", a.tls_ca]
    else:
        args += ["--ofp-tcp-listen-port", str(a.port)]
    if a.verbose:
        args.append("--verbose")
    _fix_tls_server()
    # ryu-manager loads apps given as .py paths itself.
    args += [os.path.abspath(x) if x.endswith(".py") else x for x in a.apps]
    manager.main(args=args, prog="ryu-manager")


if __name__ == "__main__":
    sys.exit(main())
