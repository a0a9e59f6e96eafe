"""L2 learning switch for OpenFlow 1.3, for os-ken and Ryu alike.

Per datapath it learns MAC -> ingress port from every packet-in, installs a
flow (in_port, eth_src, eth_dst -> output) once the destination is known, and
floods otherwise. On every (re)connection it wipes table 0 and installs the
table-miss entry that sends unmatched packets to the controller, so the
switch's flows always agree with this app's (fresh) MAC table; this matters
with fail_mode=secure, where Open vSwitch keeps flows across reconnections.

os-ken is Ryu's fork with its package renamed, so one app serves both: it
imports whichever of the two its interpreter has (each controller's venv holds
exactly one).
"""

try:
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.lib.packet import ethernet, ether_types, packet
    from os_ken.ofproto import ofproto_v1_3

    App = app_manager.OSKenApp
except ImportError:
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from ryu.lib.packet import ethernet, ether_types, packet
    from ryu.ofproto import ofproto_v1_3

    App = app_manager.RyuApp

# Learned flows expire when idle so a host that moves is relearned.
IDLE_TIMEOUT = 60
LEARNED_PRIORITY = 10


class L2Learning(App):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mac_to_port = {}

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        dp = ev.msg.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        self.mac_to_port[dp.id] = {}
        dp.send_msg(parser.OFPFlowMod(
            datapath=dp, table_id=0, command=ofp.OFPFC_DELETE,
            out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
        actions = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
        self._add_flow(dp, 0, parser.OFPMatch(), actions, idle_timeout=0)
        self.logger.info("datapath %016x connected: table-miss installed", dp.id)

    @staticmethod
    def _add_flow(dp, priority, match, actions, idle_timeout):
        ofp, parser = dp.ofproto, dp.ofproto_parser
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
        dp.send_msg(parser.OFPFlowMod(
            datapath=dp, priority=priority, match=match, instructions=inst,
            idle_timeout=idle_timeout))

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev):
        msg = ev.msg
        dp = msg.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]

        eth = packet.Packet(msg.data).get_protocol(ethernet.ethernet)
        if eth is None or eth.ethertype == ether_types.ETH_TYPE_LLDP:
            return

        table = self.mac_to_port.setdefault(dp.id, {})
        table[eth.src] = in_port
        out_port = table.get(eth.dst, ofp.OFPP_FLOOD)
        if out_port == in_port:
            return  # never hairpin: the destination is behind the ingress port

        actions = [parser.OFPActionOutput(out_port)]
        if out_port != ofp.OFPP_FLOOD:
            match = parser.OFPMatch(in_port=in_port, eth_src=eth.src, eth_dst=eth.dst)
            self._add_flow(dp, LEARNED_PRIORITY, match, actions, IDLE_TIMEOUT)
            self.logger.info("datapath %016x: learned flow %s -> %s out port %d",
                             dp.id, eth.src, eth.dst, out_port)

        data = msg.data if msg.buffer_id == ofp.OFP_NO_BUFFER else None
        dp.send_msg(parser.OFPPacketOut(
            datapath=dp, buffer_id=msg.buffer_id, in_port=in_port,
            actions=actions, data=data))
