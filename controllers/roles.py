"""Controller roles for OpenFlow 1.3 (§6.3.5), for os-ken and Ryu alike.

When a switch connects, this app asks for the role given by `--role`
(`master`, `slave` or `equal`) with a ROLE_REQUEST, and records what the
switch says and every PACKET_IN it receives. Run it beside other apps, e.g.
the master with the L2 learning app and the slave alone:

    osken/run.py --port 6653 roles.py l2_learning.py --role=master --events=/tmp/master.jsonl
    osken/run.py --port 6654 roles.py --role=slave --events=/tmp/slave.jsonl

Options (os-ken/Ryu configuration options, written `--name=value` after the
apps on the launcher's command line):

  --role=master|slave|equal   the role to request (default: equal, OpenFlow's
                              default role: nothing is sent)
  --generation-id=N           the master election generation id (0 to 2^64-1)
                              to send with a master or slave request. Without
                              it the app first asks the switch for its current
                              id (a NOCHANGE request, whose reply carries it;
                              Open vSwitch says 2^64-1 while it has none, taken
                              as 0) and uses that id for slave and the next one
                              for master.
  --events=FILE               append one JSON object per line and event:
                              {"event": "role_reply", "dpid": 1, "role": "master", "generation_id": 7}
                              also "connected", "role_request", "role_error",
                              "packet_in" (with in_port, eth_src, eth_dst),
                              "port_status" (reason, port_no, name) and
                              "disconnected"

Generation ids (§6.3.5): the switch keeps the largest generation id it has
seen in a MASTER or SLAVE request and refuses an older one (the difference
taken as a signed 64-bit number) with ROLE_REQUEST_FAILED/STALE; EQUAL and
NOCHANGE requests ignore it. A stale request from this app is recorded as
"role_error". If the id was given on the command line the app stops there
(the election that handed out the id must hand out a new one); if it came
from the switch, another controller raced it, so the app asks again, up to
three times.
"""

import json
import time

import oslo_config.cfg

try:
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import (
        CONFIG_DISPATCHER, DEAD_DISPATCHER, HANDSHAKE_DISPATCHER, MAIN_DISPATCHER, set_ev_cls)
    from os_ken.lib.packet import ethernet, packet
    from os_ken.ofproto import ofproto_v1_3

    App = app_manager.OSKenApp
except ImportError:
    from ryu import cfg
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import (
        CONFIG_DISPATCHER, DEAD_DISPATCHER, HANDSHAKE_DISPATCHER, MAIN_DISPATCHER, set_ev_cls)
    from ryu.lib.packet import ethernet, packet
    from ryu.ofproto import ofproto_v1_3

    App = app_manager.RyuApp

CONF = cfg.CONF
try:
    CONF.register_cli_opts([
        cfg.StrOpt("role", default="equal", choices=["equal", "master", "slave"],
                   help="controller role to request when a switch connects"),
        cfg.StrOpt("generation-id", default=None,
                   help="master election generation id (default: from the switch)"),
        cfg.StrOpt("events", default=None,
                   help="file to append one JSON line per event to"),
    ])
except oslo_config.cfg.ArgsAlreadyParsedError:
    pass  # Ryu imports the app a second time, after parsing the options.

ofp = ofproto_v1_3
ROLE_NAMES = {
    ofp.OFPCR_ROLE_NOCHANGE: "nochange",
    ofp.OFPCR_ROLE_EQUAL: "equal",
    ofp.OFPCR_ROLE_MASTER: "master",
    ofp.OFPCR_ROLE_SLAVE: "slave",
}
ROLES = {name: value for value, name in ROLE_NAMES.items()}
ROLE_ERRORS = {ofp.OFPRRFC_STALE: "stale", ofp.OFPRRFC_UNSUP: "unsupported",
               ofp.OFPRRFC_BAD_ROLE: "bad_role"}
MAX_QUERIES = 3
# What Open vSwitch reports as the generation id while none has been set.
UNDEFINED = (1 << 64) - 1
ANY_DISPATCHER = [HANDSHAKE_DISPATCHER, CONFIG_DISPATCHER, MAIN_DISPATCHER]


def parse_generation_id(text):
    if text is None:
        return None
    value = int(text, 0)
    if not 0 <= value < 1 << 64:
        raise ValueError("--generation-id must be between 0 and 2^64-1: %s" % text)
    return value


class Roles(App):
    OFP_VERSIONS = [ofp.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.role = ROLES[CONF.role]
        self.generation_id = parse_generation_id(CONF.generation_id)
        self.event_log = open(CONF.events, "a") if CONF.events else None
        # Per datapath: xid of the outstanding request -> "query" or "request",
        # and how many queries were sent.
        self.pending = {}
        self.queries = {}

    def record(self, event, dp, **fields):
        line = dict(event=event, dpid=dp.id, time=time.time(), **fields)
        self.logger.info("roles: %s", json.dumps(line))
        if self.event_log:
            # One writer: an app's handlers all run in its one event loop.
            self.event_log.write(json.dumps(line) + "\n")
            self.event_log.flush()

    def send(self, dp, role, generation_id, purpose):
        req = dp.ofproto_parser.OFPRoleRequest(dp, role, generation_id)
        dp.send_msg(req)  # assigns the xid
        self.pending.setdefault(dp.id, {})[req.xid] = purpose
        self.record("role_request", dp, role=ROLE_NAMES[role], generation_id=generation_id,
                    xid=req.xid, purpose=purpose)

    def query(self, dp):
        self.queries[dp.id] = self.queries.get(dp.id, 0) + 1
        # NOCHANGE ignores the generation id; the reply carries the switch's.
        self.send(dp, ofp.OFPCR_ROLE_NOCHANGE, 0, "query")

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        dp = ev.msg.datapath
        self.pending[dp.id] = {}
        self.queries[dp.id] = 0
        self.record("connected", dp)
        if self.role == ofp.OFPCR_ROLE_EQUAL:
            return  # every connection starts as EQUAL
        if self.generation_id is None:
            self.query(dp)
        else:
            self.send(dp, self.role, self.generation_id, "request")

    @set_ev_cls(ofp_event.EventOFPRoleReply, ANY_DISPATCHER)
    def role_reply(self, ev):
        msg = ev.msg
        dp = msg.datapath
        purpose = self.pending.get(dp.id, {}).pop(msg.xid, None)
        self.record("role_reply", dp, role=ROLE_NAMES.get(msg.role, msg.role),
                    generation_id=msg.generation_id, xid=msg.xid, purpose=purpose)
        if purpose == "query":
            current = msg.generation_id
            if current == UNDEFINED:
                current = 0
            wanted = (current + 1) % (1 << 64) if self.role == ofp.OFPCR_ROLE_MASTER else current
            self.send(dp, self.role, wanted, "request")

    @set_ev_cls(ofp_event.EventOFPErrorMsg, ANY_DISPATCHER)
    def error(self, ev):
        msg = ev.msg
        dp = msg.datapath
        purpose = self.pending.get(dp.id, {}).pop(msg.xid, None)
        if msg.type != ofp.OFPET_ROLE_REQUEST_FAILED:
            return
        code = ROLE_ERRORS.get(msg.code, msg.code)
        self.record("role_error", dp, code=code, xid=msg.xid, purpose=purpose)
        if (code == "stale" and self.generation_id is None
                and self.queries.get(dp.id, 0) < MAX_QUERIES):
            self.query(dp)

    @set_ev_cls(ofp_event.EventOFPPacketIn, ANY_DISPATCHER)
    def packet_in(self, ev):
        msg = ev.msg
        eth = packet.Packet(msg.data).get_protocol(ethernet.ethernet)
        self.record("packet_in", msg.datapath, in_port=msg.match.get("in_port"),
                    eth_src=eth.src if eth else None, eth_dst=eth.dst if eth else None)

    @set_ev_cls(ofp_event.EventOFPPortStatus, ANY_DISPATCHER)
    def port_status(self, ev):
        msg = ev.msg
        reasons = {ofp.OFPPR_ADD: "add", ofp.OFPPR_DELETE: "delete", ofp.OFPPR_MODIFY: "modify"}
        name = msg.desc.name
        self.record("port_status", msg.datapath, reason=reasons.get(msg.reason, msg.reason),
                    port_no=msg.desc.port_no,
                    name=name.decode(errors="replace") if isinstance(name, bytes) else name)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def disconnected(self, ev):
        dp = ev.datapath
        if dp.id is not None:
            self.record("disconnected", dp)
            self.pending.pop(dp.id, None)
