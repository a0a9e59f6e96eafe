//! Building OpenFlow 1.3 messages, for synthetic peers, tests and benchmarks.
//! The agents themselves never build messages: they forward what they receive.
//!
//! Layouts follow OpenFlow 1.3.5 §7 (`ofp_flow_mod` §7.3.4.1, `ofp_group_mod`
//! §7.3.4.2, OXM TLVs §7.2.2.2, instructions §7.2.4, actions §7.2.5).

use super::{OFP13_VERSION, message};

/// `OFPP_ANY` / `OFPG_ANY`: no restriction.
pub const ANY: u32 = 0xffff_ffff;
/// `OFPP_CONTROLLER`.
pub const CONTROLLER: u32 = 0xffff_fffd;
/// `OFP_NO_BUFFER`.
pub const NO_BUFFER: u32 = 0xffff_ffff;

/// Message type numbers of OpenFlow 1.3 (`enum ofp_type`).
pub mod msg_type {
    pub const HELLO: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const ECHO_REQUEST: u8 = 2;
    pub const ECHO_REPLY: u8 = 3;
    pub const FEATURES_REQUEST: u8 = 5;
    pub const FEATURES_REPLY: u8 = 6;
    pub const PACKET_IN: u8 = 10;
    pub const PACKET_OUT: u8 = 13;
    pub const FLOW_MOD: u8 = 14;
    pub const GROUP_MOD: u8 = 15;
    pub const MULTIPART_REQUEST: u8 = 18;
    pub const MULTIPART_REPLY: u8 = 19;
    pub const BARRIER_REQUEST: u8 = 20;
    pub const BARRIER_REPLY: u8 = 21;
}

/// One OXM match field (class OPENFLOW_BASIC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Oxm {
    InPort(u32),
    EthDst([u8; 6]),
    EthType(u16),
    IpProto(u8),
    /// Address and optional mask.
    Ipv4Dst(u32, Option<u32>),
    TcpDst(u16),
}

impl Oxm {
    fn encode(&self, out: &mut Vec<u8>) {
        // 1.3.5 §7.2.2.2: oxm_class (16) | oxm_field (7) | oxm_hasmask (1) | oxm_length (8).
        let mut tlv = |field: u8, mask: bool, value: &[u8]| {
            out.extend_from_slice(&0x8000u16.to_be_bytes());
            out.push(field << 1 | u8::from(mask));
            out.push(value.len() as u8);
            out.extend_from_slice(value);
        };
        match *self {
            Oxm::InPort(p) => tlv(0, false, &p.to_be_bytes()),
            Oxm::EthDst(a) => tlv(3, false, &a),
            Oxm::EthType(t) => tlv(5, false, &t.to_be_bytes()),
            Oxm::IpProto(p) => tlv(10, false, &[p]),
            Oxm::Ipv4Dst(a, None) => tlv(12, false, &a.to_be_bytes()),
            Oxm::Ipv4Dst(a, Some(m)) => tlv(12, true, &[a.to_be_bytes(), m.to_be_bytes()].concat()),
            Oxm::TcpDst(p) => tlv(14, false, &p.to_be_bytes()),
        }
    }
}

/// An `ofp_match` of OXM fields, padded to a multiple of 8 bytes.
pub fn ofp_match(fields: &[Oxm]) -> Vec<u8> {
    let mut tlvs = Vec::new();
    for f in fields {
        f.encode(&mut tlvs);
    }
    let mut out = Vec::with_capacity(8 + tlvs.len());
    out.extend_from_slice(&1u16.to_be_bytes()); // OFPMT_OXM
    out.extend_from_slice(&((4 + tlvs.len()) as u16).to_be_bytes());
    out.extend_from_slice(&tlvs);
    out.resize(out.len().div_ceil(8) * 8, 0);
    out
}

/// An action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Output(u32),
    Group(u32),
}

fn actions(list: &[Action]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in list {
        match *a {
            Action::Output(port) => {
                out.extend_from_slice(&[0, 0, 0, 16]); // OFPAT_OUTPUT, len 16
                out.extend_from_slice(&port.to_be_bytes());
                out.extend_from_slice(&0xffffu16.to_be_bytes()); // OFPCML_NO_BUFFER
                out.extend_from_slice(&[0; 6]);
            }
            Action::Group(g) => {
                out.extend_from_slice(&[0, 22, 0, 8]); // OFPAT_GROUP, len 8
                out.extend_from_slice(&g.to_be_bytes());
            }
        }
    }
    out
}

/// A FLOW_MOD's fields (the instruction list is one APPLY_ACTIONS, or none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowMod {
    pub cookie: u64,
    pub table: u8,
    pub command: u8,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub priority: u16,
    pub out_port: u32,
    pub out_group: u32,
    pub flags: u16,
    pub r#match: Vec<Oxm>,
    pub apply: Vec<Action>,
}

impl FlowMod {
    /// An `ADD` to table 0 with no timeouts.
    pub fn add(priority: u16, r#match: Vec<Oxm>, apply: Vec<Action>) -> FlowMod {
        FlowMod {
            cookie: 0,
            table: 0,
            command: super::fields::command::ADD,
            idle_timeout: 0,
            hard_timeout: 0,
            priority,
            out_port: ANY,
            out_group: ANY,
            flags: 0,
            r#match,
            apply,
        }
    }
}

pub fn flow_mod(xid: u32, f: &FlowMod) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&f.cookie.to_be_bytes());
    body.extend_from_slice(&0u64.to_be_bytes()); // cookie_mask
    body.push(f.table);
    body.push(f.command);
    body.extend_from_slice(&f.idle_timeout.to_be_bytes());
    body.extend_from_slice(&f.hard_timeout.to_be_bytes());
    body.extend_from_slice(&f.priority.to_be_bytes());
    body.extend_from_slice(&NO_BUFFER.to_be_bytes());
    body.extend_from_slice(&f.out_port.to_be_bytes());
    body.extend_from_slice(&f.out_group.to_be_bytes());
    body.extend_from_slice(&f.flags.to_be_bytes());
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&ofp_match(&f.r#match));
    if !f.apply.is_empty() {
        let acts = actions(&f.apply);
        body.extend_from_slice(&4u16.to_be_bytes()); // OFPIT_APPLY_ACTIONS
        body.extend_from_slice(&((8 + acts.len()) as u16).to_be_bytes());
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&acts);
    }
    message(OFP13_VERSION, msg_type::FLOW_MOD, xid, &body)
}

/// `enum ofp_group_mod_command`.
pub mod group_command {
    pub const ADD: u16 = 0;
    pub const MODIFY: u16 = 1;
    pub const DELETE: u16 = 2;
}

/// A GROUP_MOD of type ALL (each bucket gets a copy), one action list per bucket.
pub fn group_mod(xid: u32, command: u16, group_id: u32, buckets: &[Vec<Action>]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&command.to_be_bytes());
    body.push(0); // OFPGT_ALL
    body.push(0);
    body.extend_from_slice(&group_id.to_be_bytes());
    for b in buckets {
        let acts = actions(b);
        body.extend_from_slice(&((16 + acts.len()) as u16).to_be_bytes());
        body.extend_from_slice(&0u16.to_be_bytes()); // weight
        body.extend_from_slice(&ANY.to_be_bytes()); // watch_port
        body.extend_from_slice(&ANY.to_be_bytes()); // watch_group
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&acts);
    }
    message(OFP13_VERSION, msg_type::GROUP_MOD, xid, &body)
}

pub fn hello(xid: u32) -> Vec<u8> {
    message(OFP13_VERSION, msg_type::HELLO, xid, &[])
}

pub fn features_request(xid: u32) -> Vec<u8> {
    message(OFP13_VERSION, msg_type::FEATURES_REQUEST, xid, &[])
}

/// A switch's FEATURES_REPLY (1.3.5 §7.3.1): `datapath_id`, 256 buffers, 254
/// tables, main connection (auxiliary id 0), flow/table/port statistics.
pub fn features_reply(xid: u32, datapath_id: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(&datapath_id.to_be_bytes());
    body.extend_from_slice(&256u32.to_be_bytes()); // n_buffers
    body.push(254); // n_tables
    body.push(0); // auxiliary_id
    body.extend_from_slice(&[0; 2]);
    body.extend_from_slice(&0x7u32.to_be_bytes()); // capabilities
    body.extend_from_slice(&[0; 4]); // reserved
    message(OFP13_VERSION, msg_type::FEATURES_REPLY, xid, &body)
}

pub fn echo_request(xid: u32, data: &[u8]) -> Vec<u8> {
    message(OFP13_VERSION, msg_type::ECHO_REQUEST, xid, data)
}

pub fn echo_reply(xid: u32, data: &[u8]) -> Vec<u8> {
    message(OFP13_VERSION, msg_type::ECHO_REPLY, xid, data)
}

pub fn barrier_request(xid: u32) -> Vec<u8> {
    message(OFP13_VERSION, msg_type::BARRIER_REQUEST, xid, &[])
}

/// A flow-statistics MULTIPART_REQUEST for every flow of every table.
pub fn flow_stats_request(xid: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&1u16.to_be_bytes()); // OFPMP_FLOW
    body.extend_from_slice(&[0; 6]); // flags, pad
    body.push(0xff); // OFPTT_ALL
    body.extend_from_slice(&[0; 3]);
    body.extend_from_slice(&ANY.to_be_bytes());
    body.extend_from_slice(&ANY.to_be_bytes());
    body.extend_from_slice(&[0; 4]);
    body.extend_from_slice(&[0; 16]); // cookie, cookie_mask
    body.extend_from_slice(&ofp_match(&[]));
    message(OFP13_VERSION, msg_type::MULTIPART_REQUEST, xid, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openflow::fields;

    #[test]
    fn features_reply_layout() {
        let m = features_reply(9, 0x0102_0304_0506_0708);
        assert_eq!(m.len(), 32);
        let h = crate::openflow::Header::parse(&m).unwrap();
        assert_eq!(
            (h.msg_type, h.length, h.xid),
            (msg_type::FEATURES_REPLY, 32, 9)
        );
        assert_eq!(m[8..16], [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn a_built_flow_mod_reads_back() {
        let m = vec![
            Oxm::EthType(0x0800),
            Oxm::Ipv4Dst(0x0a00_0001, Some(0xffff_ff00)),
        ];
        let mut f = FlowMod::add(300, m.clone(), vec![Action::Output(2)]);
        f.command = fields::command::DELETE_STRICT;
        let msg = flow_mod(7, &f);
        let read = fields::flow_mod(&msg).unwrap();
        assert_eq!((read.command, read.id.priority, read.id.table), (4, 300, 0));
        assert_eq!(read.id.r#match, &ofp_match(&m)[..read.id.r#match.len()]);
        assert_eq!(ofp_match(&m).len() % 8, 0);
        assert_eq!(
            crate::openflow::Header::parse(&msg).unwrap().length as usize,
            msg.len()
        );
    }
}
