"""The options both controller launchers (osken/run.py, ryu/run.py) take.

    run.py [--listen-host IP] [--port N]
           [--tls-key KEY --tls-cert CERT --tls-ca CA]
           [--verbose] [APP ...] [--APP-OPTION=VALUE ...]

They become the `--ofp-*` options os-ken and Ryu share (os-ken is Ryu's fork).
With the three --tls-* options the controller listens for OpenFlow over TLS on
--port (and opens no plain TCP listener) and requires a client certificate
signed by CA. APP is a module name or a .py path; default: l2_learning.py in
this directory (one app for both controllers). Any other option is handed to
the controller as one of the apps' own configuration options (e.g. roles.py's
--role=master); write those after the apps, as --name=value.
"""

import argparse
import importlib
import os
import sys

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
    a, app_options = p.parse_known_args()
    for x in app_options:
        if not x.startswith("--"):
            p.error("unexpected argument %r: write the apps' options as --name=value, "
                    "after the apps" % x)

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
    return args + app_options, a.apps


def import_apps(apps):
    """Imports each app (a module name or a .py path) so that the options it
    registers exist before the controller parses its command line; returns
    their module names."""
    names = []
    for app in apps:
        if app.endswith(".py"):
            path = os.path.abspath(app)
            sys.path.insert(0, os.path.dirname(path))
            app = os.path.splitext(os.path.basename(path))[0]
        importlib.import_module(app)
        names.append(app)
    return names
