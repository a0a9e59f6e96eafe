//! The OpenFlow field readers the lanes key messages by, and the placement
//! rules built on them: any bytes at all give an answer (or `None`), never a
//! panic, and every slice they return lies inside the message.

use quicsdn_lanes::rules::{self, Direction, Placement};
use quicsdn_wire::openflow::{Header, Kind, fields};

fn inside(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    i >= o && i + inner.len() <= o + outer.len()
}

/// `fuzz/fuzz_targets/openflow_fields.rs`. The first byte says whether to
/// make the header's length match the message (as the framer guarantees the
/// lanes) or leave the bytes as they are.
pub fn openflow_fields(data: &[u8]) {
    let Some((&how, rest)) = data.split_first() else {
        return;
    };
    let mut m = rest.to_vec();
    if how & 1 == 0 && m.len() >= 8 && m.len() <= 65_535 {
        let len = (m.len() as u16).to_be_bytes();
        m[2..4].copy_from_slice(&len);
    }
    let m = &m[..];
    if let Some(data) = fields::packet_in_data(m) {
        assert!(inside(m, data), "packet-in data outside the message");
        assert_eq!(
            data.as_ptr() as usize + data.len(),
            m.as_ptr() as usize + m.len()
        );
        let _ = fields::flow_hash(data);
    }
    let _ = fields::port_status_port(m);
    if let Some(id) = fields::flow_removed_id(m) {
        assert!(
            inside(m, id.r#match),
            "flow-removed match outside the message"
        );
    }
    if let Some(fm) = fields::flow_mod(m) {
        assert!(
            inside(m, fm.id.r#match),
            "flow-mod match outside the message"
        );
    }
    let _ = fields::flow_hash(m);
    if let Some(h) = Header::parse(m) {
        let kind = Kind::of(h.version, h.msg_type);
        assert!(!kind.name().is_empty());
        if let Kind::Unknown(t) = kind {
            assert_eq!(t, h.msg_type);
        }
    }
    for direction in [Direction::ToSwitch, Direction::ToController] {
        for relaxed in [false, true] {
            let p = rules::place_openflow(direction, m, relaxed);
            // Echo never waits (it measures liveness); an unreadable message is a fence.
            match Header::parse(m).map(|h| h.kind()) {
                Some(Kind::EchoRequest | Kind::EchoReply) => assert_eq!(p, Placement::Priority),
                None => assert_eq!(p, Placement::Fence),
                Some(_) => assert_ne!(p, Placement::Priority),
            }
            // Placement depends on the message only: the same bytes, the same lane.
            assert_eq!(p, rules::place_openflow(direction, m, relaxed));
        }
    }
    let _ = rules::classify_jsonrpc(rest);
    let _ = rules::jsonrpc_method(rest);
}
