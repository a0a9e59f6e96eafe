"""The controller side of `quicsdn-lab bench soak`: sequence-stamped OpenFlow
traffic towards the switch, and a record of everything sent and received, for
the bench's message audit (os-ken and Ryu alike).

    osken/run.py --port 6653 soak.py --soak-dir=DIR [--soak-interval=1.0]

Every `--soak-interval` seconds, while a switch is connected, the app sends a
FLOW_MOD and an ECHO_REQUEST, and every second round a DESC stats request.
Each message carries its own sequence number as its xid (`XID_BASE + seq`,
above the xids os-ken gives its own messages); a FLOW_MOD also as its cookie.
The FLOW_MODs cycle through `SLOTS` flows (`ip,nw_dst=10.9.0.K`, priority 100,
drop), so the table stays small while every FLOW_MOD changes it.

On every new connection (a "session"), the app makes the switch's table what
it believes it installed: it deletes every flow, adds the table-miss flow
(to the controller, unbuffered) and re-adds each slot with its last cookie.

Hosts send UDP packets that miss the table, stamped with a sequence number
(four flows round robin; within a flow, TTL and DSCP count: see `stamp` in
lab/src/bench/soak.rs), which the app records from each PACKET_IN.

State (next sequence number, session count, slot cookies) lives in
DIR/state.json, so a restarted controller carries on where it stopped. Events
go to DIR/events.jsonl, one JSON object per line, with `t` (Unix seconds):

    {"ev": "up", "s": 3}                       a session began (FEATURES_REPLY)
    {"ev": "down", "s": 3}                     os-ken saw it end
    {"ev": "tx", "k": "flow_mod", "seq": 7, "s": 3}
    {"ev": "rx", "k": "packet_in", "seq": 9, "s": 3}

with `k` one of flow_mod, echo_request, stats_request (tx) and packet_in,
echo_reply, stats_reply (rx). The workload stops once DIR/stop exists.
"""

import json
import os
import struct
import time

import oslo_config.cfg

try:
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import (
        CONFIG_DISPATCHER, DEAD_DISPATCHER, HANDSHAKE_DISPATCHER, MAIN_DISPATCHER,
        set_ev_cls)
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3

    App = app_manager.OSKenApp
except ImportError:
    from ryu import cfg
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import (
        CONFIG_DISPATCHER, DEAD_DISPATCHER, HANDSHAKE_DISPATCHER, MAIN_DISPATCHER,
        set_ev_cls)
    from ryu.lib import hub
    from ryu.ofproto import ofproto_v1_3

    App = app_manager.RyuApp

CONF = cfg.CONF
try:
    CONF.register_cli_opts([
        cfg.StrOpt("soak-dir", default=None, help="state and event directory"),
        cfg.FloatOpt("soak-interval", default=1.0, help="seconds between rounds"),
    ])
except oslo_config.cfg.ArgsAlreadyParsedError:
    pass  # Ryu imports the app a second time, after parsing the options.

XID_BASE = 0x40000000
SLOTS = 32
MISS_COOKIE = 0x3fffffff
PRIORITY = 100
# The hosts' packets' stamps (lab/src/bench/soak.rs, `stamp`).
FLOWS = 4
PER_EPOCH = 250 * 64


def slot_ip(k):
    return "10.9.0.%d" % (k + 1)


class Soak(App):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dir = CONF.soak_dir
        if not self.dir:
            raise SystemExit("soak.py needs --soak-dir")
        os.makedirs(self.dir, exist_ok=True)
        self.state_path = os.path.join(self.dir, "state.json")
        try:
            with open(self.state_path) as f:
                self.state = json.load(f)
        except FileNotFoundError:
            self.state = {"seq": 0, "session": 0, "slots": {}}
        self.event_log = open(os.path.join(self.dir, "events.jsonl"), "a", buffering=1)
        self.dp = None
        self.threads.append(hub.spawn(self._workload))

    def _log(self, **ev):
        ev["t"] = time.time()
        self.event_log.write(json.dumps(ev) + "\n")

    def _save(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.state_path)

    def _next(self):
        seq = self.state["seq"]
        self.state["seq"] = seq + 1
        return seq

    def _send(self, dp, kind, msg, seq):
        msg.xid = XID_BASE + seq
        # Logged before sending: a message that dies with its session still
        # counts as sent (the audit excuses it by that session's reset).
        self._log(ev="tx", k=kind, seq=seq, s=dp.soak_session)
        dp.send_msg(msg)

    def _slot_flow(self, dp, k, cookie):
        p = dp.ofproto_parser
        seq = self._next()
        match = p.OFPMatch(eth_type=0x0800, ipv4_dst=slot_ip(k))
        msg = p.OFPFlowMod(dp, cookie=cookie, table_id=0, priority=PRIORITY,
                           match=match, instructions=[])
        return msg, seq

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev):
        dp = ev.msg.datapath
        o, p = dp.ofproto, dp.ofproto_parser
        self.state["session"] += 1
        dp.soak_session = self.state["session"]
        self._save()
        self._log(ev="up", s=dp.soak_session)
        # (self.events is os-ken's event queue: the log has another name.)
        # The table becomes what this controller believes it installed.
        seq = self._next()
        self._send(dp, "flow_mod", p.OFPFlowMod(
            dp, table_id=o.OFPTT_ALL, command=o.OFPFC_DELETE,
            out_port=o.OFPP_ANY, out_group=o.OFPG_ANY, match=p.OFPMatch()), seq)
        seq = self._next()
        actions = [p.OFPActionOutput(o.OFPP_CONTROLLER, o.OFPCML_NO_BUFFER)]
        self._send(dp, "flow_mod", p.OFPFlowMod(
            dp, cookie=MISS_COOKIE, priority=0, match=p.OFPMatch(),
            instructions=[p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, actions)]), seq)
        for k, cookie in sorted(self.state["slots"].items(), key=lambda kv: int(kv[0])):
            msg, seq = self._slot_flow(dp, int(k), cookie)
            self._send(dp, "flow_mod", msg, seq)
        self._save()
        self.dp = dp

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _dead(self, ev):
        dp = ev.datapath
        session = getattr(dp, "soak_session", None)
        if session is not None:
            self._log(ev="down", s=session)
        if self.dp is dp:
            self.dp = None

    def _workload(self):
        rounds = 0
        while True:
            hub.sleep(CONF.soak_interval)
            dp = self.dp
            if dp is None or os.path.exists(os.path.join(self.dir, "stop")):
                continue
            p = dp.ofproto_parser
            seq = self.state["seq"]
            k = seq % SLOTS
            msg, seq = self._slot_flow(dp, k, seq)
            self.state["slots"][str(k)] = seq
            self._save()
            self._send(dp, "flow_mod", msg, seq)
            seq = self._next()
            self._send(dp, "echo_request", p.OFPEchoRequest(dp, data=struct.pack("!Q", seq)), seq)
            if rounds % 2 == 0:
                seq = self._next()
                self._send(dp, "stats_request", p.OFPDescStatsRequest(dp, 0), seq)
            self._save()
            rounds += 1

    def _session(self, dp):
        # Before its FEATURES_REPLY a connection belongs to the next session.
        return getattr(dp, "soak_session", self.state["session"] + 1)

    def _rx(self, kind, msg):
        if msg.xid >= XID_BASE:
            self._log(ev="rx", k=kind, seq=msg.xid - XID_BASE, s=self._session(msg.datapath))

    @set_ev_cls(ofp_event.EventOFPEchoReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _echo_reply(self, ev):
        self._rx("echo_reply", ev.msg)

    @set_ev_cls(ofp_event.EventOFPDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _stats_reply(self, ev):
        self._rx("stats_reply", ev.msg)

    # Open vSwitch sends PACKET_INs as soon as it connects (the table-miss flow
    # outlives the session), before os-ken's handshake is done.
    @set_ev_cls(ofp_event.EventOFPPacketIn,
                [HANDSHAKE_DISPATCHER, CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _packet_in(self, ev):
        data = bytes(ev.msg.data)
        if len(data) < 42 or data[12:14] != b"\x08\x00" or data[23] != 17:
            return
        ihl = (data[14] & 0xF) * 4
        sport, dport = struct.unpack("!HH", data[14 + ihl:18 + ihl])
        tos, ttl = data[15], data[22]
        if not 1024 <= sport < 1024 + FLOWS or dport < 1024 or not 1 <= ttl <= 250:
            return
        k = (dport - 1024) * PER_EPOCH + (tos >> 2) * 250 + (ttl - 1)
        seq = k * FLOWS + (sport - 1024)
        self._log(ev="rx", k="packet_in", seq=seq, s=self._session(ev.msg.datapath))
