//! One-line summaries of whole messages, for `quicsdn snoop` (the role of
//! `ovs-ofctl snoop`'s printing): OpenFlow type, xid, length and the main
//! fields of FLOW_MOD, PACKET_IN and ERROR; OVSDB JSON-RPC method, id and size.
//!
//! Pure and tolerant: every read is bounds-checked, so a malformed or
//! truncated message gives a summary that says so, never a panic. Fields of a
//! version whose layout is not decoded here are left out rather than guessed.
//! Layouts, by version:
//! * OpenFlow 1.0.0: `ofp_match` §5.2.3, `ofp_flow_mod` §5.3.3, `ofp_packet_in`
//!   §5.4.1, `ofp_error_msg` §5.4.4.
//! * OpenFlow 1.3.5 (also 1.4 and 1.5, whose layouts of these keep the same
//!   offsets): `ofp_match` and OXM §7.2.2, `ofp_flow_mod` §7.3.4.1,
//!   `ofp_packet_in` §7.4.1, `ofp_error_msg` §7.4.4. OpenFlow 1.1 and 1.2
//!   FLOW_MODs share 1.3's fixed part; 1.2's PACKET_IN lacks the cookie.

use crate::openflow::{HEADER_LEN, Header, Kind, OFP10_VERSION, OFP11_VERSION, OFP12_VERSION};
use std::fmt::{self, Write as _};

fn u16_at(m: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(m.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(m: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(m.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(m: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(m.get(at..at + 8)?.try_into().ok()?))
}

/// `OFP_NO_BUFFER` (1.0: -1 as well).
const NO_BUFFER: u32 = 0xffff_ffff;

/// A decoded FLOW_MOD's main fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowMod {
    pub command: u8,
    pub table: u8,
    pub priority: u16,
    pub cookie: u64,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub buffer_id: u32,
    /// The match in `ovs-ofctl`'s field names (`in_port=1,eth_dst=…`), `any`
    /// when empty.
    pub r#match: String,
}

/// A decoded PACKET_IN's main fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketIn {
    pub buffer_id: u32,
    pub reason: u8,
    /// 1.0's `in_port`, or 1.2+'s OXM `in_port` in the match.
    pub in_port: Option<u32>,
    pub total_len: u16,
    pub table: Option<u8>,
}

/// A decoded ERROR's type and code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub r#type: u16,
    pub code: u16,
}

/// What the body of a message says, where decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detail {
    /// A type (or version) whose body is not decoded.
    None,
    FlowMod(FlowMod),
    PacketIn(PacketIn),
    Error(Error),
    /// The body is too short or inconsistent for its type.
    Malformed(String),
}

/// One OpenFlow message, summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFlow {
    pub version: u8,
    pub kind: Kind,
    pub xid: u32,
    /// Bytes handed in (the header's `length` if they disagree is a malformed detail).
    pub length: usize,
    pub detail: Detail,
}

/// Summarises one whole OpenFlow message (header included). `None` only when
/// there are not even 8 bytes of header.
pub fn openflow(msg: &[u8]) -> Option<OpenFlow> {
    let h = Header::parse(msg)?;
    let kind = h.kind();
    let mut out = OpenFlow {
        version: h.version,
        kind,
        xid: h.xid,
        length: msg.len(),
        detail: Detail::None,
    };
    if usize::from(h.length) != msg.len() || usize::from(h.length) < HEADER_LEN {
        out.detail = Detail::Malformed(format!(
            "header says {} bytes, {} present",
            h.length,
            msg.len()
        ));
        return Some(out);
    }
    let decoded = match kind {
        Kind::FlowMod => flow_mod(msg).map(Detail::FlowMod),
        Kind::PacketIn => packet_in(msg).map(Detail::PacketIn),
        Kind::Error => error(msg).map(Detail::Error),
        _ => return Some(out),
    };
    out.detail = match decoded {
        Some(d) => d,
        None if h.version == OFP11_VERSION && kind == Kind::PacketIn => Detail::None,
        None => Detail::Malformed(format!("{} body too short or inconsistent", kind.name())),
    };
    Some(out)
}

fn flow_mod(m: &[u8]) -> Option<FlowMod> {
    if m[0] == OFP10_VERSION {
        // 1.0.0 §5.3.3: header, match (40), cookie @48, command (16 bits) @56,
        // idle @58, hard @60, priority @62, buffer_id @64, out_port, flags;
        // OFP_ASSERT(sizeof(struct ofp_flow_mod) == 72).
        m.get(..72)?;
        return Some(FlowMod {
            command: u8::try_from(u16_at(m, 56)?).ok()?,
            table: 0,
            priority: u16_at(m, 62)?,
            cookie: u64_at(m, 48)?,
            idle_timeout: u16_at(m, 58)?,
            hard_timeout: u16_at(m, 60)?,
            buffer_id: u32_at(m, 64)?,
            r#match: match10(m.get(8..48)?),
        });
    }
    // 1.3.5 §7.3.4.1: header, cookie @8, cookie_mask @16, table_id @24,
    // command @25, idle @26, hard @28, priority @30, buffer_id @32, out_port,
    // out_group, flags, pad, match @48.
    let r#match = if m[0] == OFP11_VERSION {
        // 1.1's fixed-size `ofp_match` is not decoded.
        m.get(..48)?;
        String::from("(OpenFlow 1.1 match)")
    } else {
        oxm_match(m, 48)?.0
    };
    Some(FlowMod {
        command: *m.get(25)?,
        table: *m.get(24)?,
        priority: u16_at(m, 30)?,
        cookie: u64_at(m, 8)?,
        idle_timeout: u16_at(m, 26)?,
        hard_timeout: u16_at(m, 28)?,
        buffer_id: u32_at(m, 32)?,
        r#match,
    })
}

fn packet_in(m: &[u8]) -> Option<PacketIn> {
    match m[0] {
        // 1.0.0 §5.4.1: header, buffer_id @8, total_len @12, in_port (16 bits)
        // @14, reason @16, pad, data @18.
        OFP10_VERSION => Some(PacketIn {
            buffer_id: u32_at(m, 8)?,
            total_len: u16_at(m, 12)?,
            in_port: Some(u32::from(u16_at(m, 14)?)),
            reason: *m.get(16)?,
            table: None,
        }),
        OFP11_VERSION => None,
        // 1.2: header, buffer_id @8, total_len @12, reason @14, table_id @15,
        // match @16; 1.3.5 §7.4.1 adds the cookie @16 and the match moves to @24.
        v => {
            let at = if v == OFP12_VERSION { 16 } else { 24 };
            let (_, in_port) = oxm_match(m, at)?;
            Some(PacketIn {
                buffer_id: u32_at(m, 8)?,
                total_len: u16_at(m, 12)?,
                reason: *m.get(14)?,
                table: Some(*m.get(15)?),
                in_port,
            })
        }
    }
}

fn error(m: &[u8]) -> Option<Error> {
    // 1.0.0 §5.4.4 and 1.3.5 §7.4.4: header, type @8, code @10, data.
    Some(Error {
        r#type: u16_at(m, 8)?,
        code: u16_at(m, 10)?,
    })
}

/// 1.0.0 §5.2.3 `ofp_match`: wildcards @0, in_port @4, dl_src @6, dl_dst @12,
/// dl_vlan @18, dl_vlan_pcp @20, dl_type @22, nw_tos @24, nw_proto @25,
/// nw_src @28, nw_dst @32, tp_src @36, tp_dst @38. A field is in the match
/// unless its `OFPFW_*` wildcard bit is set; nw_src/nw_dst carry a count of
/// wildcarded low bits (≥ 32: all).
fn match10(m: &[u8]) -> String {
    let Some(w) = u32_at(m, 0) else {
        return "(truncated)".into();
    };
    let mut parts: Vec<String> = Vec::new();
    let on = |bit: u32| w & (1 << bit) == 0;
    let mut push = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            parts.push(format!("{name}={v}"));
        }
    };
    if on(0) {
        push("in_port", u16_at(m, 4).map(|p| p.to_string()));
    }
    if on(2) {
        push("dl_src", m.get(6..12).map(mac));
    }
    if on(3) {
        push("dl_dst", m.get(12..18).map(mac));
    }
    if on(1) {
        push("dl_vlan", u16_at(m, 18).map(|v| v.to_string()));
    }
    if on(20) {
        push("dl_vlan_pcp", m.get(20).map(|v| v.to_string()));
    }
    if on(4) {
        push("dl_type", u16_at(m, 22).map(|v| format!("{v:#06x}")));
    }
    if on(21) {
        push("nw_tos", m.get(24).map(|v| v.to_string()));
    }
    if on(5) {
        push("nw_proto", m.get(25).map(|v| v.to_string()));
    }
    for (name, shift, at) in [("nw_src", 8, 28), ("nw_dst", 14, 32)] {
        let wild = (w >> shift) & 0x3f;
        if wild < 32 {
            let addr = u32_at(m, at).map(|a| {
                let a = std::net::Ipv4Addr::from(a);
                if wild == 0 {
                    a.to_string()
                } else {
                    format!("{a}/{}", 32 - wild)
                }
            });
            push(name, addr);
        }
    }
    if on(6) {
        push("tp_src", u16_at(m, 36).map(|v| v.to_string()));
    }
    if on(7) {
        push("tp_dst", u16_at(m, 38).map(|v| v.to_string()));
    }
    if parts.is_empty() {
        "any".into()
    } else {
        parts.join(",")
    }
}

fn mac(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn hex(b: &[u8]) -> String {
    let mut s = String::from("0x");
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// 1.3.5 §7.2.3.7 `enum oxm_ofb_match_fields`, by field number, in
/// `ovs-ofctl`'s names.
const OXM_NAMES: [&str; 40] = [
    "in_port",
    "in_phy_port",
    "metadata",
    "eth_dst",
    "eth_src",
    "eth_type",
    "vlan_vid",
    "vlan_pcp",
    "ip_dscp",
    "ip_ecn",
    "ip_proto",
    "ipv4_src",
    "ipv4_dst",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
    "sctp_src",
    "sctp_dst",
    "icmpv4_type",
    "icmpv4_code",
    "arp_op",
    "arp_spa",
    "arp_tpa",
    "arp_sha",
    "arp_tha",
    "ipv6_src",
    "ipv6_dst",
    "ipv6_label",
    "icmpv6_type",
    "icmpv6_code",
    "nd_target",
    "nd_sll",
    "nd_tll",
    "mpls_label",
    "mpls_tc",
    "mpls_bos",
    "pbb_isid",
    "tunnel_id",
    "ipv6_exthdr",
];

/// The value of one OXM field, formatted by its kind.
fn oxm_value(field: u8, v: &[u8]) -> String {
    match (field, v.len()) {
        (3 | 4 | 24 | 25 | 32 | 33, 6) => mac(v),
        (11 | 12 | 22 | 23, 4) => {
            std::net::Ipv4Addr::from(<[u8; 4]>::try_from(v).unwrap_or_default()).to_string()
        }
        (26 | 27 | 31, 16) => {
            std::net::Ipv6Addr::from(<[u8; 16]>::try_from(v).unwrap_or_default()).to_string()
        }
        (5, 2) => hex(v),
        (_, 1..=8) => v
            .iter()
            .fold(0u64, |a, &b| a << 8 | u64::from(b))
            .to_string(),
        _ => hex(v),
    }
}

/// The OXM `ofp_match` at `at`: its summary and the `in_port` it matches.
/// 1.3.5 §7.2.2: `type` (OFPMT_OXM = 1), `length` excluding padding, then TLVs
/// of `oxm_class` (16) | `oxm_field` (7) | `oxm_hasmask` (1) | `oxm_length` (8)
/// (§7.2.2.2); a masked field carries value then mask, each half the length.
fn oxm_match(m: &[u8], at: usize) -> Option<(String, Option<u32>)> {
    let len = usize::from(u16_at(m, at + 2)?);
    if u16_at(m, at)? != 1 || len < 4 {
        return None;
    }
    let mut tlvs = m.get(at + 4..at + len)?;
    let mut parts = Vec::new();
    let mut in_port = None;
    while !tlvs.is_empty() {
        let header = u32_at(tlvs, 0)?;
        let class = (header >> 16) as u16;
        let field = ((header >> 9) & 0x7f) as u8;
        let masked = header & 0x100 != 0;
        let n = (header & 0xff) as usize;
        let payload = tlvs.get(4..4 + n)?;
        tlvs = &tlvs[4 + n..];
        if class != 0x8000 {
            parts.push(format!("oxm({class:#06x}:{field})={}", hex(payload)));
            continue;
        }
        let name = OXM_NAMES
            .get(usize::from(field))
            .map_or_else(|| format!("field{field}"), |s| (*s).to_string());
        let (value, mask) = if masked && n.is_multiple_of(2) {
            payload.split_at(n / 2)
        } else {
            (payload, &[][..])
        };
        if field == 0 && value.len() == 4 {
            in_port = u32_at(value, 0);
        }
        if mask.is_empty() {
            parts.push(format!("{name}={}", oxm_value(field, value)));
        } else {
            parts.push(format!(
                "{name}={}/{}",
                oxm_value(field, value),
                oxm_value(field, mask)
            ));
        }
    }
    let summary = if parts.is_empty() {
        "any".into()
    } else {
        parts.join(",")
    };
    Some((summary, in_port))
}

/// `enum ofp_flow_mod_command` (the same numbers in every version).
pub fn command_name(c: u8) -> String {
    match c {
        0 => "ADD".into(),
        1 => "MODIFY".into(),
        2 => "MODIFY_STRICT".into(),
        3 => "DELETE".into(),
        4 => "DELETE_STRICT".into(),
        c => format!("command{c}"),
    }
}

/// `enum ofp_packet_in_reason`: 1.0.0 §5.4.1 (NO_MATCH, ACTION), 1.3.5 §7.4.1
/// adds INVALID_TTL; 1.4 renamed NO_MATCH to TABLE_MISS.
fn reason_name(r: u8) -> String {
    match r {
        0 => "NO_MATCH".into(),
        1 => "ACTION".into(),
        2 => "INVALID_TTL".into(),
        r => format!("reason{r}"),
    }
}

/// `enum ofp_error_type`: 1.0.0 §5.4.4, 1.3.5 §7.4.4.
fn error_type_name(version: u8, t: u16) -> String {
    const V10: [&str; 6] = [
        "HELLO_FAILED",
        "BAD_REQUEST",
        "BAD_ACTION",
        "FLOW_MOD_FAILED",
        "PORT_MOD_FAILED",
        "QUEUE_OP_FAILED",
    ];
    const V13: [&str; 14] = [
        "HELLO_FAILED",
        "BAD_REQUEST",
        "BAD_ACTION",
        "BAD_INSTRUCTION",
        "BAD_MATCH",
        "FLOW_MOD_FAILED",
        "GROUP_MOD_FAILED",
        "PORT_MOD_FAILED",
        "TABLE_MOD_FAILED",
        "QUEUE_OP_FAILED",
        "SWITCH_CONFIG_FAILED",
        "ROLE_REQUEST_FAILED",
        "METER_MOD_FAILED",
        "TABLE_FEATURES_FAILED",
    ];
    let names: &[&str] = if version == OFP10_VERSION { &V10 } else { &V13 };
    match names.get(usize::from(t)) {
        Some(n) => (*n).to_string(),
        None if t == 0xffff && version != OFP10_VERSION => "EXPERIMENTER".into(),
        None => format!("type{t}"),
    }
}

fn version_name(v: u8) -> String {
    match v {
        1..=6 => format!("OF1.{}", v - 1),
        v => format!("OFv{v:#04x}"),
    }
}

impl fmt::Display for OpenFlow {
    /// `FLOW_MOD OF1.3 xid=0x1a len=96 cmd=ADD table=0 …`: `key=value`
    /// tokens, so the line reads like `ovs-ofctl snoop` and greps easily.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Unknown(t) => format!("type{t}"),
            k => k.name().to_string(),
        };
        write!(
            f,
            "{kind} {} xid={:#x} len={}",
            version_name(self.version),
            self.xid,
            self.length
        )?;
        let buffer = |b: u32| {
            if b == NO_BUFFER {
                "none".to_string()
            } else {
                b.to_string()
            }
        };
        match &self.detail {
            Detail::None => Ok(()),
            Detail::FlowMod(m) => write!(
                f,
                " cmd={} table={} priority={} cookie={:#x} idle_timeout={} hard_timeout={} buffer={} match={}",
                command_name(m.command),
                m.table,
                m.priority,
                m.cookie,
                m.idle_timeout,
                m.hard_timeout,
                buffer(m.buffer_id),
                m.r#match
            ),
            Detail::PacketIn(p) => {
                write!(
                    f,
                    " buffer={} reason={} total_len={}",
                    buffer(p.buffer_id),
                    reason_name(p.reason),
                    p.total_len
                )?;
                if let Some(port) = p.in_port {
                    write!(f, " in_port={port}")?;
                }
                if let Some(t) = p.table {
                    write!(f, " table={t}")?;
                }
                Ok(())
            }
            Detail::Error(e) => write!(
                f,
                " type={}({}) code={}",
                error_type_name(self.version, e.r#type),
                e.r#type,
                e.code
            ),
            Detail::Malformed(why) => write!(f, " MALFORMED: {why}"),
        }
    }
}

/// One line for any OpenFlow frame, even one too short for a header.
pub fn openflow_line(msg: &[u8]) -> String {
    match openflow(msg) {
        Some(s) => s.to_string(),
        None => format!("MALFORMED OpenFlow: {} bytes, no whole header", msg.len()),
    }
}

/// What a JSON-RPC message is (RFC 7047 §4: OVSDB's JSON-RPC 1.0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonRpcKind {
    /// `method` and a non-null `id`.
    Request,
    /// `method` and a null `id`.
    Notification,
    /// `result` (and null `error`).
    Reply,
    /// A non-null `error`.
    Error,
}

/// One JSON-RPC message, summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonRpc {
    pub kind: JsonRpcKind,
    pub method: Option<String>,
    /// The `id`, as compact JSON (`3`, `"echo"`, `null`).
    pub id: String,
    pub length: usize,
}

/// Summarises one whole JSON-RPC message; `Err` says why it is not one.
pub fn jsonrpc(msg: &[u8]) -> Result<JsonRpc, String> {
    let v: serde_json::Value = serde_json::from_slice(msg).map_err(|e| e.to_string())?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let id = obj
        .get("id")
        .map_or_else(|| "null".into(), |i| i.to_string());
    let method = obj.get("method").and_then(|m| m.as_str()).map(String::from);
    let kind = if method.is_some() {
        if obj.get("id").is_none_or(|i| i.is_null()) {
            JsonRpcKind::Notification
        } else {
            JsonRpcKind::Request
        }
    } else if obj.get("error").is_some_and(|e| !e.is_null()) {
        JsonRpcKind::Error
    } else if obj.contains_key("result") {
        JsonRpcKind::Reply
    } else {
        return Err("neither a request nor a reply".into());
    };
    Ok(JsonRpc {
        kind,
        method,
        id,
        length: msg.len(),
    })
}

impl fmt::Display for JsonRpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            JsonRpcKind::Request => "request",
            JsonRpcKind::Notification => "notification",
            JsonRpcKind::Reply => "reply",
            JsonRpcKind::Error => "error",
        };
        write!(f, "JSON-RPC {kind}")?;
        if let Some(m) = &self.method {
            write!(f, " method={m}")?;
        }
        write!(f, " id={} len={}", self.id, self.length)
    }
}

/// One line for any JSON-RPC frame.
pub fn jsonrpc_line(msg: &[u8]) -> String {
    match jsonrpc(msg) {
        Ok(s) => s.to_string(),
        Err(e) => format!("MALFORMED JSON-RPC len={}: {e}", msg.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openflow::build::{self, Oxm};
    use crate::openflow::message;

    #[test]
    fn flow_mod_13_fields_and_match() {
        let mut fm = build::FlowMod::add(
            1,
            vec![
                Oxm::InPort(1),
                Oxm::EthDst([2, 0x51, 0, 0, 0, 2]),
                Oxm::EthType(0x0800),
                Oxm::Ipv4Dst(0x0a00_0000, Some(0xff00_0000)),
            ],
            vec![build::Action::Output(2)],
        );
        fm.cookie = 0xabc;
        fm.table = 3;
        fm.idle_timeout = 10;
        fm.hard_timeout = 60;
        let msg = build::flow_mod(0x1a, &fm);
        let s = openflow(&msg).unwrap();
        assert_eq!(s.kind, Kind::FlowMod);
        assert_eq!(s.xid, 0x1a);
        let Detail::FlowMod(d) = &s.detail else {
            panic!("{s:?}")
        };
        assert_eq!(
            (
                d.command,
                d.table,
                d.priority,
                d.cookie,
                d.idle_timeout,
                d.hard_timeout
            ),
            (0, 3, 1, 0xabc, 10, 60)
        );
        assert_eq!(
            d.r#match,
            "in_port=1,eth_dst=02:51:00:00:00:02,eth_type=0x0800,ipv4_dst=10.0.0.0/255.0.0.0"
        );
        assert_eq!(
            s.to_string(),
            format!(
                "FLOW_MOD OF1.3 xid=0x1a len={} cmd=ADD table=3 priority=1 cookie=0xabc \
                 idle_timeout=10 hard_timeout=60 buffer=none match={}",
                msg.len(),
                d.r#match
            )
        );
    }

    /// An OpenFlow 1.0 FLOW_MOD as 1.0.0 §5.3.3 lays it out.
    fn flow_mod_10() -> Vec<u8> {
        let mut body = Vec::new();
        // ofp_match: wildcards all but in_port, dl_dst, dl_type and nw_dst/24.
        let wild: u32 = 0x003f_ffff & !(1 | 1 << 3 | 1 << 4) & !(0x3f << 14) | 8 << 14;
        body.extend_from_slice(&wild.to_be_bytes());
        body.extend_from_slice(&3u16.to_be_bytes()); // in_port
        body.extend_from_slice(&[0; 6]); // dl_src
        body.extend_from_slice(&[2, 0x51, 0, 0, 0, 1]); // dl_dst
        body.extend_from_slice(&[0; 4]); // dl_vlan, pcp, pad
        body.extend_from_slice(&0x0800u16.to_be_bytes());
        body.extend_from_slice(&[0; 4]); // tos, proto, pad
        body.extend_from_slice(&[0; 4]); // nw_src
        body.extend_from_slice(&[10, 0, 0, 7]); // nw_dst
        body.extend_from_slice(&[0; 4]); // tp_src, tp_dst
        assert_eq!(body.len(), 40);
        body.extend_from_slice(&7u64.to_be_bytes()); // cookie
        body.extend_from_slice(&4u16.to_be_bytes()); // DELETE_STRICT
        body.extend_from_slice(&5u16.to_be_bytes()); // idle
        body.extend_from_slice(&0u16.to_be_bytes()); // hard
        body.extend_from_slice(&0x8000u16.to_be_bytes()); // priority
        body.extend_from_slice(&42u32.to_be_bytes()); // buffer_id
        body.extend_from_slice(&0xffffu16.to_be_bytes()); // out_port
        body.extend_from_slice(&0u16.to_be_bytes()); // flags
        message(OFP10_VERSION, 14, 9, &body)
    }

    #[test]
    fn flow_mod_10_fields_and_wildcards() {
        let msg = flow_mod_10();
        assert_eq!(msg.len(), 72);
        let s = openflow(&msg).unwrap();
        let Detail::FlowMod(d) = &s.detail else {
            panic!("{s:?}")
        };
        assert_eq!(
            (d.command, d.priority, d.cookie, d.idle_timeout),
            (4, 0x8000, 7, 5)
        );
        assert_eq!(d.buffer_id, 42);
        assert_eq!(
            d.r#match,
            "in_port=3,dl_dst=02:51:00:00:00:01,dl_type=0x0800,nw_dst=10.0.0.7/24"
        );
        assert!(
            s.to_string()
                .starts_with("FLOW_MOD OF1.0 xid=0x9 len=72 cmd=DELETE_STRICT")
        );
    }

    #[test]
    fn packet_in_10_and_13() {
        // 1.0: buffer_id, total_len, in_port, reason, pad, data.
        let mut body = Vec::new();
        body.extend_from_slice(&0x100u32.to_be_bytes());
        body.extend_from_slice(&98u16.to_be_bytes());
        body.extend_from_slice(&2u16.to_be_bytes());
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&[0xaa; 14]);
        let s = openflow(&message(OFP10_VERSION, 10, 1, &body)).unwrap();
        assert_eq!(
            s.detail,
            Detail::PacketIn(PacketIn {
                buffer_id: 0x100,
                reason: 1,
                in_port: Some(2),
                total_len: 98,
                table: None
            })
        );
        // 1.3: buffer_id, total_len, reason, table_id, cookie, match, pad, data.
        let mut body = Vec::new();
        body.extend_from_slice(&NO_BUFFER.to_be_bytes());
        body.extend_from_slice(&60u16.to_be_bytes());
        body.extend_from_slice(&[0, 4]);
        body.extend_from_slice(&0u64.to_be_bytes());
        body.extend_from_slice(&build::ofp_match(&[Oxm::InPort(7)]));
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&[0xbb; 60]);
        let s = openflow(&message(crate::openflow::OFP13_VERSION, 10, 2, &body)).unwrap();
        assert!(
            s.to_string()
                .ends_with("buffer=none reason=NO_MATCH total_len=60 in_port=7 table=4"),
            "{s}"
        );
    }

    #[test]
    fn errors_of_both_versions() {
        let body = [0, 1, 0, 6, 1, 2, 3, 4];
        let s = openflow(&message(crate::openflow::OFP13_VERSION, 1, 5, &body)).unwrap();
        assert!(s.to_string().ends_with("type=BAD_REQUEST(1) code=6"), "{s}");
        let body = [0, 3, 0, 0];
        let s = openflow(&message(OFP10_VERSION, 1, 5, &body)).unwrap();
        assert!(
            s.to_string().ends_with("type=FLOW_MOD_FAILED(3) code=0"),
            "{s}"
        );
    }

    #[test]
    fn malformed_messages_say_so() {
        assert!(openflow_line(&[4, 14, 0]).starts_with("MALFORMED"));
        // A FLOW_MOD cut short.
        let msg = message(crate::openflow::OFP13_VERSION, 14, 3, &[0; 20]);
        let line = openflow_line(&msg);
        assert!(
            line.starts_with("FLOW_MOD OF1.3 xid=0x3 len=28 MALFORMED"),
            "{line}"
        );
        // A length that disagrees with the bytes.
        let mut msg = build::hello(1);
        msg.push(0);
        assert!(openflow_line(&msg).contains("MALFORMED: header says 8 bytes, 9 present"));
        // An OXM TLV running past the match.
        let mut m = build::ofp_match(&[Oxm::InPort(1)]);
        m[7] = 200;
        let mut body = vec![0u8; 40];
        body.extend_from_slice(&m);
        let line = openflow_line(&message(crate::openflow::OFP13_VERSION, 14, 3, &body));
        assert!(line.contains("MALFORMED"), "{line}");
    }

    #[test]
    fn jsonrpc_kinds() {
        let r = jsonrpc(br#"{"method":"transact","params":["Open_vSwitch"],"id":3}"#).unwrap();
        assert_eq!(
            r.to_string(),
            "JSON-RPC request method=transact id=3 len=54"
        );
        let r = jsonrpc(br#"{"method":"update","params":[null,{}],"id":null}"#).unwrap();
        assert_eq!(r.kind, JsonRpcKind::Notification);
        let r = jsonrpc(br#"{"result":[],"error":null,"id":"echo"}"#).unwrap();
        assert_eq!(r.to_string(), r#"JSON-RPC reply id="echo" len=38"#);
        let r = jsonrpc(br#"{"result":null,"error":"no","id":4}"#).unwrap();
        assert_eq!(r.kind, JsonRpcKind::Error);
        assert!(jsonrpc_line(b"{\"id\":").starts_with("MALFORMED JSON-RPC len=6"));
        assert!(jsonrpc_line(b"[1]").contains("not a JSON object"));
    }

    proptest::proptest! {
        /// Tolerant: any bytes give a line, never a panic.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
                        version in 0u8..8, kind in proptest::prop_oneof![proptest::strategy::Just(1u8), proptest::strategy::Just(10), proptest::strategy::Just(14)]) {
            let _ = openflow_line(&bytes);
            let _ = jsonrpc_line(&bytes);
            let mut msg = bytes.clone();
            if msg.len() >= 8 {
                msg[0] = version;
                msg[1] = kind;
                let n = msg.len() as u16;
                msg[2..4].copy_from_slice(&n.to_be_bytes());
                let _ = openflow_line(&msg);
            }
        }
    }
}
