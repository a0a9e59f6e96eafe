"""SDUDP's path (issue 15), for os-ken and Ryu alike (OpenFlow 1.3).

The lab's `line` topology with `--sdudp` runs this app alone. When switch I
(datapath id I) connects, it replaces the switch's flow table with:

  * priority 0: NORMAL (OVS's own L2 learning) for everything else (ARP,
    ICMP, plain traffic; the line has no loop);
  * on an edge (switch 1 or N): each host's TCP to the TCP engine's port,
    destination MAC rewritten to the engine's (the engine's kernel then
    terminates it), and the engine's frames for a host to the host's port;
  * on a switch with an engine: UDP arriving from the line to the engine's
    port, and the engine's frames to the previous or next engine (by their
    MACs) out of the port on that side;
  * on a switch without an engine: UDP from the line straight on, so the
    engines on either side talk to each other across it;

then a BARRIER_REQUEST; when the reply comes (OpenFlow 1.3 §6.2: every
message before the barrier has been processed) it appends
{"event": "path_installed", "dpid": I, "rules": K} to the events file, which
is how `quicsdn-lab up` knows the path is ready.

Options (written `--name=value` after the app on the launcher's command line):

  --sdudp-path=FILE    the path (JSON), written by quicsdn-lab:
                       {"switches": N, "engines": [1, 3, 5],
                        "engine_port": 100, "prev_port": 1001, "next_port": 1002,
                        "engine_macs": {"1": "02:..", ...},
                        "hosts": {"1": [[1, "02:.."]], "5": [[1, "02:.."]]}}
  --sdudp-events=FILE  where to append the events (one JSON object per line)
"""

import json

import oslo_config.cfg

try:
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.ofproto import ether, inet, ofproto_v1_3

    App = app_manager.OSKenApp
except ImportError:
    from ryu import cfg
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from ryu.ofproto import ether, inet, ofproto_v1_3

    App = app_manager.RyuApp

CONF = cfg.CONF
try:
    CONF.register_cli_opts([
        cfg.StrOpt("sdudp-path", default=None, help="the SDUDP path (JSON file)"),
        cfg.StrOpt("sdudp-events", default=None, help="file to append events to"),
    ])
except oslo_config.cfg.ArgsAlreadyParsedError:
    pass  # Ryu imports the app a second time, after parsing the options.

EDGE_PRIORITY = 20
PATH_PRIORITY = 10


def rules(path, i):
    """The (priority, match fields, actions) of switch `i`; actions are
    ("output", port) or ("set_eth_dst", mac)."""
    n = path["switches"]
    engines = path["engines"]
    eng_port, prev_port, next_port = path["engine_port"], path["prev_port"], path["next_port"]
    macs = {int(k): v for k, v in path["engine_macs"].items()}
    out = []
    if i in (1, n):
        for port, mac in path["hosts"].get(str(i), []):
            out.append((EDGE_PRIORITY, {"in_port": port, "eth_type": ether.ETH_TYPE_IP,
                                        "ip_proto": inet.IPPROTO_TCP},
                        [("set_eth_dst", macs[i]), ("output", eng_port)]))
            out.append((EDGE_PRIORITY, {"in_port": eng_port, "eth_dst": mac},
                        [("output", port)]))
    udp = {"eth_type": ether.ETH_TYPE_IP, "ip_proto": inet.IPPROTO_UDP}
    before = [e for e in engines if e < i]
    after = [e for e in engines if e > i]
    if i in engines:
        for side, port in ((i > 1, prev_port), (i < n, next_port)):
            if side:
                out.append((PATH_PRIORITY, dict(udp, in_port=port), [("output", eng_port)]))
        if before:
            out.append((PATH_PRIORITY, {"in_port": eng_port, "eth_dst": macs[before[-1]]},
                        [("output", prev_port)]))
        if after:
            out.append((PATH_PRIORITY, {"in_port": eng_port, "eth_dst": macs[after[0]]},
                        [("output", next_port)]))
    elif 1 < i < n:
        out.append((PATH_PRIORITY, dict(udp, in_port=prev_port), [("output", next_port)]))
        out.append((PATH_PRIORITY, dict(udp, in_port=next_port), [("output", prev_port)]))
    return out


class SdudpPath(App):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not CONF.sdudp_path:
            raise SystemExit("sdudp_path.py needs --sdudp-path=FILE")
        with open(CONF.sdudp_path) as f:
            self.path = json.load(f)
        self.pending = {}

    def _event(self, **e):
        if CONF.sdudp_events:
            with open(CONF.sdudp_events, "a") as f:
                f.write(json.dumps(e) + "\n")

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        dp = ev.msg.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        if not 1 <= dp.id <= self.path["switches"]:
            self.logger.warning("datapath %d is not on the SDUDP path; left alone", dp.id)
            return
        dp.send_msg(parser.OFPFlowMod(
            datapath=dp, table_id=0, command=ofp.OFPFC_DELETE,
            out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
        table = [(0, {}, [("output", ofp.OFPP_NORMAL)])] + rules(self.path, dp.id)
        for priority, match, actions in table:
            acts = []
            for kind, arg in actions:
                if kind == "output":
                    acts.append(parser.OFPActionOutput(arg))
                else:
                    acts.append(parser.OFPActionSetField(eth_dst=arg))
            inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, acts)]
            dp.send_msg(parser.OFPFlowMod(datapath=dp, priority=priority,
                                          match=parser.OFPMatch(**match), instructions=inst))
        self.pending[dp.id] = len(table)
        dp.send_msg(parser.OFPBarrierRequest(dp))
        self.logger.info("datapath %d: %d SDUDP path rules sent", dp.id, len(table))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def barrier_reply(self, ev):
        dpid = ev.msg.datapath.id
        if dpid in self.pending:
            self._event(event="path_installed", dpid=dpid, rules=self.pending.pop(dpid))
