//! Ethernet frames of SDUDP traffic: what an engine reads from its switch
//! port and what it writes back (pure functions, no I/O).

use bytes::Bytes;
use quicsdn_sdudp::ipv4::{self, UdpHeader};
use quicsdn_sdudp::{Control, FlowKey};
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

pub const ETH_HEADER: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl std::str::FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Mac, String> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(format!(
                "{s:?} is not a MAC address (six hex bytes separated by ':')"
            ));
        }
        let mut m = [0; 6];
        for (b, p) in m.iter_mut().zip(parts) {
            *b = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?} is not a MAC address"))?;
        }
        Ok(Mac(m))
    }
}

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// What a frame read from the switch is to an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A numbered datagram of a flow.
    Data {
        flow: FlowKey,
        id: u16,
        payload: Bytes,
    },
    /// A control message from a neighbouring engine.
    Control(Control),
    /// Well-formed but not SDUDP traffic for this engine (ARP, other UDP…).
    Other,
    /// SDUDP-addressed but malformed (bad checksum, fragment, bad message).
    Malformed(String),
}

/// Which UDP traffic is SDUDP's.
#[derive(Debug, Clone)]
pub struct Ports {
    /// UDP ports of flows (each connection has its own port pair in this range).
    pub data: RangeInclusive<u16>,
    /// UDP port of control messages between adjacent engines.
    pub control: u16,
}

/// Classifies a frame; returns its source MAC with it.
pub fn classify(frame: &[u8], own_ip: Ipv4Addr, ports: &Ports) -> (Mac, Incoming) {
    let mut src = [0; 6];
    if frame.len() < ETH_HEADER {
        return (Mac(src), Incoming::Other);
    }
    src.copy_from_slice(&frame[6..12]);
    let src = Mac(src);
    if u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4 {
        return (src, Incoming::Other);
    }
    let ip = &frame[ETH_HEADER..];
    // Only look closer at UDP to one of our ports (cheap pre-check on the
    // header bytes before checksumming).
    if ip.len() < ipv4::IPV4_HEADER + ipv4::UDP_HEADER || ip[9] != 17 {
        return (src, Incoming::Other);
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip.len() < ihl + ipv4::UDP_HEADER {
        return (src, Incoming::Other);
    }
    let dport = u16::from_be_bytes([ip[ihl + 2], ip[ihl + 3]]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let is_control = dport == ports.control && dst == own_ip;
    if !is_control && !ports.data.contains(&dport) {
        return (src, Incoming::Other);
    }
    let (h, range) = match ipv4::parse(ip) {
        Ok(x) => x,
        Err(e) => return (src, Incoming::Malformed(e.to_string())),
    };
    let payload = Bytes::copy_from_slice(&ip[range]);
    if is_control {
        return match Control::decode(&payload) {
            Ok(c) => (src, Incoming::Control(c)),
            Err(e) => (src, Incoming::Malformed(e.to_string())),
        };
    }
    (
        src,
        Incoming::Data {
            flow: FlowKey {
                src: h.src,
                dst: h.dst,
                sport: h.sport,
                dport: h.dport,
            },
            id: h.id,
            payload,
        },
    )
}

fn ethernet(dst: Mac, src: Mac, ip: Vec<u8>) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HEADER + ip.len());
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    f.extend_from_slice(&ip);
    f
}

/// A numbered datagram of `flow` as a frame to the next hop: the IPv4 header
/// keeps the flow's addresses and carries the sequence number as its ID.
pub fn data_frame(dst: Mac, src: Mac, flow: FlowKey, id: u16, payload: &[u8]) -> Vec<u8> {
    ethernet(
        dst,
        src,
        ipv4::build(&UdpHeader::for_flow(flow, id), payload),
    )
}

/// A control message as a frame from this engine to a neighbour.
pub fn control_frame(
    dst: (Mac, Ipv4Addr),
    src: (Mac, Ipv4Addr),
    port: u16,
    control: &Control,
) -> Vec<u8> {
    let h = UdpHeader {
        src: src.1,
        dst: dst.1,
        // Control messages are not sequenced; an atomic datagram's ID may be
        // anything (RFC 6864 §4.1).
        id: 0,
        ttl: 64,
        tos: 0,
        sport: port,
        dport: port,
    };
    ethernet(dst.0, src.0, ipv4::build(&h, &control.encode()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quicsdn_sdudp::Direction;

    const PORTS: Ports = Ports {
        data: 49_152..=50_151,
        control: 49_151,
    };

    fn flow() -> FlowKey {
        FlowKey {
            src: Ipv4Addr::new(10, 0, 1, 254),
            dst: Ipv4Addr::new(10, 0, 5, 254),
            sport: 49_200,
            dport: 49_300,
        }
    }

    #[test]
    fn data_and_control_frames_round_trip() {
        let a: Mac = "02:51:00:00:01:fe".parse().unwrap();
        let b: Mac = "02:51:00:00:02:fe".parse().unwrap();
        let me = Ipv4Addr::new(10, 0, 2, 254);
        let f = data_frame(b, a, flow(), 65_535, b"\x01hello");
        assert_eq!(
            classify(&f, me, &PORTS),
            (
                a,
                Incoming::Data {
                    flow: flow(),
                    id: 65_535,
                    payload: Bytes::from_static(b"\x01hello")
                }
            )
        );
        let c = Control::Fail {
            flow: flow(),
            toward: Direction::Upstream,
            reason: quicsdn_sdudp::FailReason::Silent,
        };
        let f = control_frame((b, me), (a, Ipv4Addr::new(10, 0, 3, 254)), 49_151, &c);
        assert_eq!(classify(&f, me, &PORTS), (a, Incoming::Control(c.clone())));
        // A control message for another engine is not ours.
        let other = Ipv4Addr::new(10, 0, 9, 254);
        assert_eq!(classify(&f, other, &PORTS).1, Incoming::Other);
        // Corruption is reported, not passed on.
        let mut bad = data_frame(b, a, flow(), 1, b"\x01x");
        *bad.last_mut().unwrap() ^= 0xff;
        assert!(matches!(
            classify(&bad, me, &PORTS).1,
            Incoming::Malformed(_)
        ));
        assert_eq!(classify(&[0; 10], me, &PORTS).1, Incoming::Other);
        assert_eq!(a.to_string(), "02:51:00:00:01:fe");
        assert!("02:51".parse::<Mac>().is_err());
    }
}
