"""The options both controller launchers (osken/run.py, ryu/run.py) take.

    run.py [--listen-host IP] [--port N]
           [--tls-key KEY --tls-cert CERT --tls-ca CA]
           [--verbose] [APP ...]

They become the `--ofp-*` options os-ken and Ryu share (os-ken is Ryu's fork).
With the three --tls-* options the controller listens for OpenFlow over TLS on
--port (and opens no plain TCP listener) and requires a client certificate
signed by CA. APP is a module name or a .py path; default: l2_learning.py in
this directory (one app for both controllers).
"""

import argparse
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(description):
    """Parses the command line; returns (controller options, apps)."""
    p = argparse.ArgumentParser(description=description)
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
    return args, a.apps
