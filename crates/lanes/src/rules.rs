//! The ordering rules of the `safe` stream mode, written once: [`RULES`] is the
//! table the scheduler runs on, and `docs/streams.md` shows the same table
//! (a test keeps the two identical).
//!
//! What the rules protect. Open vSwitch processes each controller connection
//! strictly in order and answers BARRIER at once; Faucet turns barriers off for
//! OVS; Ryu apps send "delete all flows" then the table-miss entry with no
//! barrier. So everything the controller sends stays in order, and on the way
//! back only messages OpenFlow itself calls independent may overtake each other.

use quicsdn_wire::openflow::fields::{self, Fnv, OFPFF_CHECK_OVERLAP, command};
use quicsdn_wire::openflow::{Header, Kind};

/// Which way a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Controller → switch.
    ToSwitch,
    /// Switch → controller.
    ToController,
}

/// Where the scheduler puts a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The session's main stream, in order with everything else on it.
    Main,
    /// The priority stream: never waits behind anything.
    Priority,
    /// One of the keyed streams; messages with the same key stay in order.
    Keyed(u64),
    /// The main stream, as a fence: delivered only after everything sent before
    /// it, and everything sent after it is delivered after it.
    Fence,
}

/// How a rule chooses a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    Main,
    Priority,
    Fence,
    /// Keyed by the packet's flow (addresses, protocol, ports).
    ByPacketFlow,
    /// Keyed by the reported port.
    ByPort,
    /// Keyed by the flow entry (table, priority, match).
    ByFlowEntry,
    /// Keyed by the transaction id, so a multipart sequence and any ERROR of the
    /// same request stay together and in order.
    ByXid,
    /// With `--relaxed-flow-mods`: strict FLOW_MODs (and plain adds) keyed by flow
    /// entry; non-strict MODIFY/DELETE and adds with CHECK_OVERLAP are fences.
    /// Without it: the main stream.
    RelaxedFlowMod,
}

/// One row of the rules table.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub direction: Direction,
    pub kinds: &'static [Kind],
    pub how: How,
    /// The specification text the rule rests on.
    pub why: &'static str,
}

use Direction::*;
use Kind::*;

/// Until the handshake completes (the switch's FEATURES_REPLY), every message
/// of a session uses the main stream.
pub const HANDSHAKE_RULE: &str = "Until FEATURES_REPLY: one stream. OpenFlow 1.3.5 §6.3.1 (Connection Setup): after the HELLO exchange \"one of the first things that the controller should do is to send a OFPT_FEATURES_REQUEST message\"; controllers treat the switch as ready only once its FEATURES_REPLY arrives, so nothing may overtake it.";

/// The rules, first match wins. A kind no rule names takes the direction's
/// default: [`How::Main`] towards the switch, [`How::Fence`] towards the
/// controller (an unknown message is ordered against everything).
pub const RULES: &[Rule] = &[
    Rule {
        direction: ToSwitch,
        kinds: &[EchoRequest, EchoReply],
        how: How::Priority,
        why: "OpenFlow 1.3.5 §7.5.2 (Echo Request): echo messages \"are mainly used to verify the liveness of a controller-switch connection\"; they change no state, so they may overtake anything.",
    },
    Rule {
        direction: ToSwitch,
        kinds: &[FlowMod],
        how: How::RelaxedFlowMod,
        why: "OpenFlow 1.3.5 §6.2 (Message Handling): \"In the absence of barrier messages, switches may arbitrarily reorder messages\" — a controller that depends on order must use barriers. Only with --relaxed-flow-mods; entries are identified by table, priority and match (§5.2).",
    },
    Rule {
        direction: ToSwitch,
        kinds: &[
            GroupMod,
            MeterMod,
            BarrierRequest,
            RoleRequest,
            BundleControl,
            BundleAddMessage,
        ],
        how: How::Fence,
        why: "OpenFlow 1.3.5 §6.2: \"Messages must not be reordered across a barrier message\"; group and meter mods change what later flow mods refer to; role and bundle messages change how everything after them is processed (\"Multiple Controllers\"; OpenFlow 1.4 \"Bundle Messages\").",
    },
    Rule {
        direction: ToController,
        kinds: &[EchoRequest, EchoReply],
        how: How::Priority,
        why: "OpenFlow 1.3.5 §7.5.2 (Echo Request): echo messages verify liveness and carry no state.",
    },
    Rule {
        direction: ToController,
        kinds: &[PacketIn],
        how: How::ByPacketFlow,
        why: "OpenFlow 1.3.5 §7.4.1: packet-ins are asynchronous and independent; packets of one flow keep their order.",
    },
    Rule {
        direction: ToController,
        kinds: &[PortStatus],
        how: How::ByPort,
        why: "OpenFlow 1.3.5 §7.4.3: port status reports one port's change; changes of one port keep their order.",
    },
    Rule {
        direction: ToController,
        kinds: &[FlowRemoved],
        how: How::ByFlowEntry,
        why: "OpenFlow 1.3.5 §7.4.2: flow-removed reports one entry; reports of one entry keep their order.",
    },
    Rule {
        direction: ToController,
        kinds: &[
            MultipartReply,
            Error,
            FeaturesReply,
            GetConfigReply,
            QueueGetConfigReply,
            GetAsyncReply,
        ],
        how: How::ByXid,
        why: "OpenFlow 1.3.5 §7.3.5: a multipart reply is a sequence of messages with one xid, OFPMPF_REPLY_MORE on all but the last; §7.4.4: an error carries the xid of the request that caused it. Replies to one request stay together and in order.",
    },
    Rule {
        direction: ToController,
        kinds: &[
            BarrierReply,
            RoleReply,
            RoleStatus,
            BundleControl,
            BundleAddMessage,
        ],
        how: How::Fence,
        why: "OpenFlow 1.3.5 §6.2: \"messages before a barrier must be fully processed before the barrier, including sending any resulting replies or errors\"; role and bundle replies change how the controller reads what follows.",
    },
];

/// The rule for a message kind in a direction.
pub fn rule_for(direction: Direction, kind: Kind) -> Option<&'static Rule> {
    RULES
        .iter()
        .find(|r| r.direction == direction && r.kinds.contains(&kind))
}

/// Places one whole OpenFlow message. `relaxed` enables `--relaxed-flow-mods`
/// (it only affects messages towards the switch).
pub fn place_openflow(direction: Direction, msg: &[u8], relaxed: bool) -> Placement {
    let Some(header) = Header::parse(msg) else {
        return Placement::Fence;
    };
    let how = rule_for(direction, header.kind())
        .map(|r| r.how)
        .unwrap_or(match direction {
            ToSwitch => How::Main,
            ToController => How::Fence,
        });
    let keyed = |tag: u8, feed: &dyn Fn(&mut Fnv)| {
        let mut h = Fnv::new();
        h.write(&[tag]);
        feed(&mut h);
        Placement::Keyed(h.finish())
    };
    match how {
        How::Main => Placement::Main,
        How::Priority => Placement::Priority,
        How::Fence => Placement::Fence,
        // Unreadable layouts fall back to one key per kind: still in order.
        How::ByPacketFlow => match fields::packet_in_data(msg) {
            Some(frame) => keyed(1, &|h| h.write(&fields::flow_hash(frame).to_be_bytes())),
            None => keyed(1, &|_| {}),
        },
        How::ByPort => keyed(2, &|h| {
            if let Some(p) = fields::port_status_port(msg) {
                h.write(&p.to_be_bytes());
            }
        }),
        How::ByFlowEntry => keyed(3, &|h| {
            if let Some(id) = fields::flow_removed_id(msg) {
                write_flow_id(h, &id);
            }
        }),
        How::ByXid => keyed(4, &|h| h.write(&header.xid.to_be_bytes())),
        How::RelaxedFlowMod if !relaxed => Placement::Main,
        How::RelaxedFlowMod => match fields::flow_mod(msg) {
            Some(fm)
                if matches!(fm.command, command::MODIFY_STRICT | command::DELETE_STRICT)
                    || (fm.command == command::ADD && fm.flags & OFPFF_CHECK_OVERLAP == 0) =>
            {
                keyed(3, &|h| write_flow_id(h, &fm.id))
            }
            // Non-strict modify/delete touch many entries; an add that checks for
            // overlaps depends on other entries: both are fences.
            _ => Placement::Fence,
        },
    }
}

fn write_flow_id(h: &mut Fnv, id: &fields::FlowId<'_>) {
    h.write(&[id.table]);
    h.write(&id.priority.to_be_bytes());
    h.write(id.r#match);
}

/// Largest JSON-RPC message inspected for `echo`: OVS's echo requests and
/// replies are tens of bytes; bigger messages are never parsed.
pub const JSONRPC_ECHO_MAX: usize = 1024;

/// What a JSON-RPC message is, as far as the scheduler cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonRpc {
    /// An `echo` request, with its id (RFC 7047 §4.1.11: "echo" is used "to
    /// verify the liveness of a database connection").
    EchoRequest(String),
    /// A reply (result or error) with this id.
    Reply(String),
    Other,
}

/// The fields of a (small) JSON-RPC message the agents look at.
#[derive(serde::Deserialize)]
struct Peek {
    method: Option<String>,
    id: Option<serde_json::Value>,
    result: Option<serde::de::IgnoredAny>,
    error: Option<serde::de::IgnoredAny>,
}

fn peek_jsonrpc(msg: &[u8]) -> Option<Peek> {
    if msg.len() > JSONRPC_ECHO_MAX {
        return None;
    }
    serde_json::from_slice::<Peek>(msg).ok()
}

/// Classifies a (small) JSON-RPC message; anything it cannot read is `Other`.
pub fn classify_jsonrpc(msg: &[u8]) -> JsonRpc {
    let Some(p) = peek_jsonrpc(msg) else {
        return JsonRpc::Other;
    };
    let id = match p.id {
        Some(serde_json::Value::Null) | None => return JsonRpc::Other,
        Some(id) => id.to_string(),
    };
    match p.method.as_deref() {
        Some("echo") => JsonRpc::EchoRequest(id),
        Some(_) => JsonRpc::Other,
        None if p.result.is_some() || p.error.is_some() => JsonRpc::Reply(id),
        None => JsonRpc::Other,
    }
}

/// The OVSDB methods the agents treat specially (RFC 7047 §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonRpcMethod {
    Echo,
    GetSchema,
    Other,
}

/// The method of a (small) JSON-RPC request or notification; `None` for a
/// reply or anything unreadable.
pub fn jsonrpc_method(msg: &[u8]) -> Option<JsonRpcMethod> {
    Some(match peek_jsonrpc(msg)?.method?.as_str() {
        "echo" => JsonRpcMethod::Echo,
        "get_schema" => JsonRpcMethod::GetSchema,
        _ => JsonRpcMethod::Other,
    })
}

/// The rules as a markdown table (for `docs/streams.md`).
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| direction | messages | placement | why (specification) |\n|---|---|---|---|\n",
    );
    out += &format!("| both | everything | main stream | {HANDSHAKE_RULE} |\n");
    for r in RULES {
        let dir = match r.direction {
            ToSwitch => "controller → switch",
            ToController => "switch → controller",
        };
        let kinds: Vec<&str> = r.kinds.iter().map(|k| k.name()).collect();
        let how = match r.how {
            How::Main => "main stream",
            How::Priority => "priority stream",
            How::Fence => "fence on the main stream",
            How::ByPacketFlow => "keyed stream by the packet's flow",
            How::ByPort => "keyed stream by port",
            How::ByFlowEntry => "keyed stream by flow entry (table, priority, match)",
            How::ByXid => "keyed stream by xid",
            How::RelaxedFlowMod => {
                "main stream; with --relaxed-flow-mods: strict mods and plain adds keyed by flow entry, non-strict modify/delete and CHECK_OVERLAP adds as fences"
            }
        };
        out += &format!("| {dir} | {} | {how} | {} |\n", kinds.join(", "), r.why);
    }
    out += "| controller → switch | anything else | main stream | FIFO per OpenFlow connection, as Open vSwitch processes it. |\n";
    out += "| switch → controller | anything else | fence on the main stream | Unknown messages are ordered against everything. |\n";
    out += "| OVSDB, both | JSON-RPC `echo` requests and their replies | priority stream | RFC 7047 §4.1.11: echo verifies liveness. |\n";
    out += "| OVSDB, both | everything else | main stream | One ordered stream per connection. |\n";
    out
}
