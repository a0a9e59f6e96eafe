#!/usr/bin/env python3
"""Launch Ryu 4.34 with the lab's L2 learning app (or other apps).

    run.py [--listen-host IP] [--port N]
           [--tls-key KEY --tls-cert CERT --tls-ca CA]
           [--verbose] [APP ...] [--APP-OPTION=VALUE ...]

(options: controllers/launcher.py, shared with the other launcher)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import launcher  # noqa: E402  (controllers/launcher.py: the shared options)

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



def main():
    args, apps = launcher.parse(__doc__.split("\n\n")[0])
    _fix_tls_server()
    # Import the apps once so the options they register exist when ryu-manager
    # parses its command line (it imports them again, after parsing).
    launcher.import_apps(apps)
    # ryu-manager loads apps given as .py paths itself.
    args += [os.path.abspath(x) if x.endswith(".py") else x for x in apps]
    manager.main(args=args, prog="ryu-manager")


if __name__ == "__main__":
    sys.exit(main())
