"""Bicast and unicast flows for the multihomed lab (paper
`quic-sdn-multihomed-bicast`, Tables III-V), for os-ken and Ryu alike.

The lab (quicsdn-lab, lab/src/multihomed.rs) has two switches, numbered by
datapath id, each with the same OpenFlow port numbers:

    server ── [dpid 1: port 1=server, 2=path A, 3=path B] ══ path A ══
                                                          ══ path B ══ [dpid 2: 2=path A, 3=path B, 1=client] ── client

On the server-side switch (dpid 1) everything from the server goes to group 1,
type ALL with one bucket per path, in `bicast` mode (Tables III-IV: every
packet of the server→client direction on both paths), or straight out of path
A in `unicast` mode (Table V, no group). What comes back on either path goes to the
server. On the client-side switch (dpid 2) both paths are merged onto the
client's port, and the client's packets (ACKs, requests) take path A only, as
in the paper (it bicasts the server's direction only). The paper rewrites the
source IP per path because its client has one address per path; here the
client-side switch merges the paths onto one address, so no rewrite is
needed and a duplicate is a duplicate packet number to QUIC (and a duplicate
segment to TCP).

Matching on ports instead of IP addresses also carries ARP, so the hosts need
no static neighbours (the paper's controller answers ARP itself).

Options (written `--name=value` after the apps on the launcher's command line):

  --bicast-mode=bicast|unicast|bicast-both   default bicast

`bicast-both` also duplicates the client side's packets onto both paths (a
group of type ALL on the client-side switch too): the lab's control-channel
bicast, where the "client" is a switch agent whose QUIC connection to its
controller agent must survive one lossy or cut path in either direction.

Each switch's rules are installed when it connects: its old flows and groups
are deleted first, then a BARRIER; the app logs one `bicast: installed` line
per switch after the BARRIER reply.
"""

import oslo_config.cfg

try:
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.ofproto import ofproto_v1_3

    App = app_manager.OSKenApp
except ImportError:
    from ryu import cfg
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from ryu.ofproto import ofproto_v1_3

    App = app_manager.RyuApp

CONF = cfg.CONF
try:
    CONF.register_cli_opts([
        cfg.StrOpt("bicast-mode", default="bicast", choices=["bicast", "unicast", "bicast-both"],
                   help="duplicate the server's packets onto both paths, or use path A"),
    ])
except oslo_config.cfg.ArgsAlreadyParsedError:
    pass  # Ryu imports the app a second time, after parsing the options.

ofp = ofproto_v1_3
SERVER_SIDE, CLIENT_SIDE = 1, 2
HOST_PORT, PATH_A, PATH_B = 1, 2, 3
GROUP = 1


class Bicast(App):
    OFP_VERSIONS = [ofp.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mode = CONF.bicast_mode
        self.barriers = {}

    def flow(self, dp, in_port, actions):
        parser = dp.ofproto_parser
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
        dp.send_msg(parser.OFPFlowMod(dp, priority=100, match=parser.OFPMatch(in_port=in_port),
                                      instructions=inst))

    def both_paths(self, dp):
        """Everything from the host port to group 1: type ALL, one bucket per
        path, so every bucket gets a copy of the packet (OpenFlow 1.3 §5.6.1)."""
        parser = dp.ofproto_parser
        buckets = [parser.OFPBucket(actions=[parser.OFPActionOutput(p)]) for p in (PATH_A, PATH_B)]
        dp.send_msg(parser.OFPGroupMod(dp, command=ofp.OFPGC_ADD, type_=ofp.OFPGT_ALL,
                                       group_id=GROUP, buckets=buckets))
        self.flow(dp, HOST_PORT, [parser.OFPActionGroup(GROUP)])

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        dp = ev.msg.datapath
        parser = dp.ofproto_parser
        out = parser.OFPActionOutput
        if dp.id not in (SERVER_SIDE, CLIENT_SIDE):
            self.logger.warning("bicast: datapath %d is not part of the multihomed lab; "
                                "leaving it alone", dp.id)
            return
        # A fresh start: no flow or group of an earlier mode survives (OpenFlow
        # 1.3 §A.3.4.1 delete with a wildcard match, §A.3.4.2 OFPG_ALL).
        dp.send_msg(parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                                      match=parser.OFPMatch()))
        dp.send_msg(parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL))
        if dp.id == SERVER_SIDE:
            if self.mode in ("bicast", "bicast-both"):
                self.both_paths(dp)
            else:
                self.flow(dp, HOST_PORT, [out(PATH_A)])
            self.flow(dp, PATH_A, [out(HOST_PORT)])
            self.flow(dp, PATH_B, [out(HOST_PORT)])
        else:
            self.flow(dp, PATH_A, [out(HOST_PORT)])
            self.flow(dp, PATH_B, [out(HOST_PORT)])
            if self.mode == "bicast-both":
                self.both_paths(dp)
            else:
                self.flow(dp, HOST_PORT, [out(PATH_A)])
        barrier = parser.OFPBarrierRequest(dp)
        dp.send_msg(barrier)
        self.barriers[dp.id] = barrier.xid

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def barrier_reply(self, ev):
        dp = ev.msg.datapath
        if self.barriers.get(dp.id) == ev.msg.xid:
            del self.barriers[dp.id]
            self.logger.info("bicast: installed %s rules on datapath %d", self.mode, dp.id)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error(self, ev):
        msg = ev.msg
        self.logger.error("bicast: datapath %d refused a message: type %d code %d",
                          msg.datapath.id, msg.type, msg.code)
