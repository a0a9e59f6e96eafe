#!/usr/bin/env python3
"""Launch os-ken 4.2.2 with the lab's L2 learning app (or other apps).

os-ken 4.x ships no `osken-manager`, so this does what that manager did:
patch the hub, register the OpenFlow controller options, parse them, init
logging, run the apps until killed.

    run.py [--listen-host IP] [--port N]
           [--tls-key KEY --tls-cert CERT --tls-ca CA]
           [--verbose] [APP ...] [--APP-OPTION=VALUE ...]

(options: controllers/launcher.py, shared with the other launcher)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import launcher  # noqa: E402  (controllers/launcher.py: the shared options)

from os_ken.lib import hub

hub.patch(thread=False)

# app_manager first: importing controller.controller first is a circular import.
from os_ken.base.app_manager import AppManager  # noqa: E402
import os_ken.controller.controller  # noqa: E402,F401  (registers the --ofp-* options)
from os_ken import cfg, log  # noqa: E402


def main():
    args, apps = launcher.parse(__doc__.split("\n\n")[0])
    # Apps first: they register their own options, which the parse below knows then.
    modules = launcher.import_apps(apps)
    cfg.CONF(args, project="os_ken", default_config_files=[])
    log.init_log()
    AppManager.run_apps(modules)


if __name__ == "__main__":
    main()
