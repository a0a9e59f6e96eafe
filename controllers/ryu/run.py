#!/usr/bin/env python3
"""Launch Ryu 4.34 with the lab's L2 learning app (or other apps).

Same options as controllers/osken/run.py:

    run.py [--listen-host IP] [--port N]
           [--tls-key KEY --tls-cert CERT --tls-ca CA]
           [--verbose] [APP ...]

With the three --tls-* options Ryu listens for OpenFlow over TLS on --port
(and opens no plain TCP listener) and requires a client certificate signed
by CA. APP is a module name or a .py path; default: l2_learning.py next to
this file.
"""

import argparse
import os
import sys

# Ryu 4.34 predates eventlet 0.33's removal of wsgi.ALREADY_HANDLED, which
# ryu.app.wsgi reads at import time; an opaque sentinel is all it needs.
import eventlet.wsgi

if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
    eventlet.wsgi.ALREADY_HANDLED = object()

from ryu.cmd import manager  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen-host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=6653)
    p.add_argument("--tls-key")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-ca")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("apps", nargs="*", default=[os.path.join(HERE, "l2_learning.py")])
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
    # ryu-manager loads apps given as .py paths itself.
    args += [os.path.abspath(x) if x.endswith(".py") else x for x in a.apps]
    manager.main(args=args, prog="ryu-manager")


if __name__ == "__main__":
    sys.exit(main())
