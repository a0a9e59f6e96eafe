//! The few message fields the stream scheduler keys on, read in place.
//!
//! Every function takes a whole message (header included) and returns `None`
//! when the version's layout is not one this module knows or the message is too
//! short: callers then fall back to a conservative placement, never a guess.
//! Offsets follow each version's `struct` layout (OpenFlow 1.0.0 §5, 1.3.5 §7,
//! 1.5.1 §7); OpenFlow 1.1 is read only where its layout matches 1.2+.

use super::{OFP10_VERSION, OFP11_VERSION, OFP15_VERSION};

fn u16_at(m: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(m.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(m: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(m.get(at..at + 4)?.try_into().ok()?))
}

/// The `struct ofp_match` (OXM, OpenFlow 1.2+) starting at `at`: its bytes
/// without padding, and its length padded to 8. OpenFlow 1.3.5 §7.2.2 (Flow
/// Match Structures): `length` is the "Length of ofp_match (excluding padding)",
/// and the structure is padded to a multiple of 8 bytes.
fn oxm_match(m: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len = usize::from(u16_at(m, at + 2)?);
    if len < 4 {
        return None;
    }
    Some((m.get(at..at + len)?, len.div_ceil(8) * 8))
}

/// The packet a PACKET_IN carries (its `data`), or `None` for an unknown layout.
pub fn packet_in_data(m: &[u8]) -> Option<&[u8]> {
    let start = match m.first()? {
        // 1.0.0 §5.4.1: header, buffer_id, total_len, in_port, reason, pad, data.
        &OFP10_VERSION => 18,
        // 1.1.0 §A.4.1: header, buffer_id, in_port, in_phy_port, total_len, reason, table_id, data.
        &OFP11_VERSION => 24,
        // 1.2: header, buffer_id, total_len, reason, table_id, match, pad[2], data.
        0x03 => 16 + oxm_match(m, 16)?.1 + 2,
        // 1.3.5 §7.4.1 (and 1.4, 1.5): ... table_id, cookie, match, pad[2], data.
        _ => 24 + oxm_match(m, 24)?.1 + 2,
    };
    m.get(start..)
}

/// The port a PORT_STATUS reports: `ofp_port`'s `port_no` after `reason` and
/// 7 bytes of padding (16-bit in 1.0, 32-bit later).
pub fn port_status_port(m: &[u8]) -> Option<u32> {
    match m.first()? {
        &OFP10_VERSION => u16_at(m, 16).map(u32::from),
        _ => u32_at(m, 16),
    }
}

/// What identifies a flow entry: table, priority and match. OpenFlow 1.3.5 §5.2
/// (Flow Table): "A flow table entry is identified by its match fields and
/// priority".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowId<'a> {
    pub table: u8,
    pub priority: u16,
    pub r#match: &'a [u8],
}

/// The flow entry a FLOW_REMOVED reports.
pub fn flow_removed_id(m: &[u8]) -> Option<FlowId<'_>> {
    match *m.first()? {
        // 1.0.0 §5.4.2: header, match (40 bytes), cookie, priority, ...
        OFP10_VERSION => Some(FlowId {
            table: 0,
            priority: u16_at(m, 56)?,
            r#match: m.get(8..48)?,
        }),
        OFP11_VERSION => None,
        // 1.5.1 §7.4.2: header, table_id, reason, priority, idle, hard, cookie, match.
        v if v >= OFP15_VERSION => Some(FlowId {
            table: *m.get(8)?,
            priority: u16_at(m, 10)?,
            r#match: oxm_match(m, 24)?.0,
        }),
        // 1.2–1.4 (1.3.5 §7.4.2): header, cookie, priority, reason, table_id,
        // durations, timeouts, counters, match at 48.
        _ => Some(FlowId {
            table: *m.get(19)?,
            priority: u16_at(m, 16)?,
            r#match: oxm_match(m, 48)?.0,
        }),
    }
}

/// `enum ofp_flow_mod_command` (the same numbers in every version).
pub mod command {
    pub const ADD: u8 = 0;
    pub const MODIFY: u8 = 1;
    pub const MODIFY_STRICT: u8 = 2;
    pub const DELETE: u8 = 3;
    pub const DELETE_STRICT: u8 = 4;
}

/// `OFPFF_CHECK_OVERLAP` (1 << 1 in every version).
pub const OFPFF_CHECK_OVERLAP: u16 = 1 << 1;

/// The fields of a FLOW_MOD the scheduler needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowMod<'a> {
    pub id: FlowId<'a>,
    pub command: u8,
    pub flags: u16,
}

/// Reads a FLOW_MOD.
pub fn flow_mod(m: &[u8]) -> Option<FlowMod<'_>> {
    match *m.first()? {
        // 1.0.0 §5.3.3: header, match (40), cookie, command (16-bit), idle, hard,
        // priority, buffer_id, out_port, flags.
        OFP10_VERSION => Some(FlowMod {
            id: FlowId {
                table: 0,
                priority: u16_at(m, 62)?,
                r#match: m.get(8..48)?,
            },
            command: u8::try_from(u16_at(m, 56)?).ok()?,
            flags: u16_at(m, 70)?,
        }),
        // 1.1+ (1.3.5 §7.3.4.1): header, cookie, cookie_mask, table_id, command,
        // idle, hard, priority, buffer_id, out_port, out_group, flags, pad, match.
        _ => Some(FlowMod {
            id: FlowId {
                table: *m.get(24)?,
                priority: u16_at(m, 30)?,
                r#match: oxm_match(m, 48)?.0,
            },
            command: *m.get(25)?,
            flags: u16_at(m, 44)?,
        }),
    }
}

/// Hashes the header fields that make packets "one flow": Ethernet addresses and
/// type (after VLAN tags), IPv4/IPv6 addresses and protocol, TCP/UDP/SCTP ports,
/// ARP's protocol addresses. Packets of one flow hash alike; the hash is FNV-1a,
/// stable across runs and machines.
pub fn flow_hash(frame: &[u8]) -> u64 {
    let mut h = Fnv::new();
    h.write(frame.get(..12).unwrap_or(frame));
    let mut at = 12;
    let mut ethertype = u16_at(frame, at);
    // 802.1Q / 802.1ad tags.
    while let Some(0x8100 | 0x88a8 | 0x9100) = ethertype {
        at += 4;
        ethertype = u16_at(frame, at);
    }
    let Some(ethertype) = ethertype else {
        return h.finish();
    };
    h.write(&ethertype.to_be_bytes());
    let l3 = at + 2;
    let (proto, l4) = match ethertype {
        0x0800 => {
            let ihl = usize::from(frame.get(l3).map_or(5, |b| b & 0x0f)) * 4;
            h.write(frame.get(l3 + 12..l3 + 20).unwrap_or(&[]));
            (frame.get(l3 + 9).copied(), l3 + ihl)
        }
        0x86dd => {
            h.write(frame.get(l3 + 8..l3 + 40).unwrap_or(&[]));
            (frame.get(l3 + 6).copied(), l3 + 40)
        }
        0x0806 => {
            // ARP for IPv4: sender protocol address at 14, target at 24.
            h.write(frame.get(l3 + 14..l3 + 18).unwrap_or(&[]));
            h.write(frame.get(l3 + 24..l3 + 28).unwrap_or(&[]));
            (None, 0)
        }
        _ => (None, 0),
    };
    if let Some(p) = proto {
        h.write(&[p]);
        if matches!(p, 6 | 17 | 132) {
            h.write(frame.get(l4..l4 + 4).unwrap_or(&[]));
        }
    }
    h.finish()
}

/// FNV-1a, 64 bit: tiny, stable, good enough to spread keys over a few streams.
pub struct Fnv(u64);

impl Fnv {
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv {
    fn default() -> Self {
        Fnv::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openflow::{OFP13_VERSION, message};

    /// An OXM match with one 4-byte field (length 12, padded to 16).
    fn oxm(field_value: u32) -> Vec<u8> {
        let mut m = vec![0, 1, 0, 12, 0x80, 0, 0, 4];
        m.extend_from_slice(&field_value.to_be_bytes());
        m.extend_from_slice(&[0; 4]);
        m
    }

    fn ipv4_tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, vlan: bool) -> Vec<u8> {
        let mut f = vec![0xaa; 6];
        f.extend_from_slice(&[0xbb; 6]);
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0; 16]); // rest of TCP, differs per packet below
        f
    }

    #[test]
    fn packet_in_data_per_version() {
        let frame = ipv4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 1000, 80, false);
        // 1.3: buffer_id, total_len, reason, table_id, cookie, match, pad, data.
        let mut body = vec![0xff; 4];
        body.extend_from_slice(&(frame.len() as u16).to_be_bytes());
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&[0; 8]);
        body.extend_from_slice(&oxm(3));
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&frame);
        let m = message(OFP13_VERSION, 10, 0, &body);
        assert_eq!(packet_in_data(&m), Some(&frame[..]));
        // 1.0: buffer_id, total_len, in_port, reason, pad, data.
        let mut body = vec![0xff; 4];
        body.extend_from_slice(&[0, 60, 0, 1, 0, 0]);
        body.extend_from_slice(&frame);
        assert_eq!(
            packet_in_data(&message(OFP10_VERSION, 10, 0, &body)),
            Some(&frame[..])
        );
        // Truncated: no data, no panic.
        assert_eq!(packet_in_data(&m[..30]), None);
    }

    #[test]
    fn one_flow_hashes_alike_other_flows_do_not() {
        let a = ipv4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 1000, 80, false);
        let mut a2 = a.clone();
        a2[40] = 0x55; // TCP sequence number: not part of the flow
        let b = ipv4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 1001, 80, false);
        let c = ipv4_tcp([10, 0, 0, 3], [10, 0, 0, 2], 1000, 80, false);
        assert_eq!(flow_hash(&a), flow_hash(&a2));
        assert_ne!(flow_hash(&a), flow_hash(&b));
        assert_ne!(flow_hash(&a), flow_hash(&c));
        // VLAN tags are skipped, the rest still counts.
        let v = ipv4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 1000, 80, true);
        let v2 = ipv4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 1001, 80, true);
        assert_ne!(flow_hash(&v), flow_hash(&v2));
        // Garbage and short frames hash without panicking.
        let _ = flow_hash(&[]);
        let _ = flow_hash(&[0x81, 0x00]);
    }

    #[test]
    fn flow_mod_and_flow_removed_fields() {
        // 1.3 FLOW_MOD: cookie, cookie_mask, table 7, MODIFY_STRICT, idle, hard,
        // priority 300, buffer, out_port, out_group, flags CHECK_OVERLAP, pad, match.
        let mut body = vec![0; 16];
        body.extend_from_slice(&[7, command::MODIFY_STRICT, 0, 0, 0, 0]);
        body.extend_from_slice(&300u16.to_be_bytes());
        body.extend_from_slice(&[0; 12]);
        body.extend_from_slice(&OFPFF_CHECK_OVERLAP.to_be_bytes());
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&oxm(9));
        let m = message(OFP13_VERSION, 14, 1, &body);
        let fm = flow_mod(&m).unwrap();
        assert_eq!(
            (fm.id.table, fm.id.priority, fm.command, fm.flags),
            (7, 300, 2, 2)
        );
        assert_eq!(fm.id.r#match, &oxm(9)[..12]);
        // 1.3 FLOW_REMOVED: cookie, priority 300, reason, table 7, ... match at 48.
        let mut body = vec![0; 8];
        body.extend_from_slice(&300u16.to_be_bytes());
        body.extend_from_slice(&[0, 7]);
        body.extend_from_slice(&[0; 28]);
        body.extend_from_slice(&oxm(9));
        let removed = message(OFP13_VERSION, 11, 0, &body);
        let fr = flow_removed_id(&removed).unwrap();
        assert_eq!(fr, fm.id, "the removed flow is the one the FLOW_MOD named");
        // 1.0 FLOW_MOD: match (40), cookie, command DELETE_STRICT, idle, hard, priority 5.
        let mut body = vec![0x11; 40];
        body.extend_from_slice(&[0; 8]);
        body.extend_from_slice(&[0, 4, 0, 0, 0, 0, 0, 5]);
        body.extend_from_slice(&[0; 8]);
        let m10 = message(OFP10_VERSION, 14, 1, &body);
        let fm = flow_mod(&m10).unwrap();
        assert_eq!(
            (fm.command, fm.id.priority, fm.id.r#match.len()),
            (4, 5, 40)
        );
    }

    #[test]
    fn port_status_ports() {
        let mut body = vec![0; 8];
        body.extend_from_slice(&0x0001_0002u32.to_be_bytes());
        body.extend_from_slice(&[0; 60]);
        assert_eq!(
            port_status_port(&message(OFP13_VERSION, 12, 0, &body)),
            Some(0x0001_0002)
        );
        let mut body = vec![0; 8];
        body.extend_from_slice(&[0x00, 0x07]);
        assert_eq!(
            port_status_port(&message(OFP10_VERSION, 12, 0, &body)),
            Some(7)
        );
    }
}
