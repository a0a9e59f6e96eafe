#!/usr/bin/env python3
"""Launch os-ken 4.2.2 with the lab's L2 learning app (or other apps).

os-ken 4.x ships no `osken-manager`, so this does what that manager did:
patch the hub, register the OpenFlow controller options, parse them, init
logging, run the apps until killed.

    run.py [--listen-host IP] [--port N]
           [--tls-key KEY --tls-cert CERT --tls-ca CA]
           [--verbose] [APP ...]

With the three --tls-* options it listens for OpenFlow over TLS on --port
(os-ken then opens no plain TCP listener) and requires a client certificate
signed by CA. APP is a module name or a .py path; default: ../l2_learning.py
(shared with the other controller).
"""

import argparse
import os
import sys

from os_ken.lib import hub

hub.patch(thread=False)

# app_manager first: importing controller.controller first is a circular import.
from os_ken.base.app_manager import AppManager  # noqa: E402
import os_ken.controller.controller  # noqa: E402,F401  (registers the --ofp-* options)
from os_ken import cfg, log  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def app_module(app):
    """Turn a .py path into an importable module name."""
    if app.endswith(".py"):
        path = os.path.abspath(app)
        sys.path.insert(0, os.path.dirname(path))
        return os.path.splitext(os.path.basename(path))[0]
    return app


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

    cfg.CONF(args, project="os_ken", default_config_files=[])
    log.init_log()
    AppManager.run_apps([app_module(x) for x in a.apps])


if __name__ == "__main__":
    main()
