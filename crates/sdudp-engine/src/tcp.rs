//! The TCP frames an edge engine looks at itself: a host's SYN (held until
//! the far host accepted, its options passed on) and the RST it forges when
//! the far host refused. Everything else of TCP is the kernel's.

use crate::frame::{ETH_HEADER, ETHERTYPE_IPV4, Mac};
use quicsdn_sdudp::TcpOptions;
use quicsdn_sdudp::ipv4;
use std::net::{Ipv4Addr, SocketAddrV4};

const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;

/// A host's connection request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Syn {
    pub client_mac: Mac,
    pub client: SocketAddrV4,
    pub server: SocketAddrV4,
    pub seq: u32,
    pub options: TcpOptions,
    /// The frame as it came.
    pub frame: Vec<u8>,
}

impl Syn {
    /// The same frame addressed to `dst` (Ethernet only; the IP packet is
    /// untouched).
    pub fn frame_with_dst(&self, dst: Mac) -> Vec<u8> {
        let mut f = self.frame.clone();
        f[..6].copy_from_slice(&dst.0);
        f
    }
}

/// A pure SYN (no ACK) in an Ethernet/IPv4 frame, or None.
pub fn parse_syn(frame: &[u8]) -> Option<Syn> {
    if frame.len() < ETH_HEADER + 20 + 20
        || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4
    {
        return None;
    }
    let ip = &frame[ETH_HEADER..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != 6 || ip.len() < ihl + 20 {
        return None;
    }
    let tcp = &ip[ihl..];
    let flags = tcp[13];
    if flags & (SYN | ACK | RST) != SYN {
        return None;
    }
    let off = usize::from(tcp[12] >> 4) * 4;
    if off < 20 || tcp.len() < off {
        return None;
    }
    let mut options = TcpOptions::default();
    let mut o = &tcp[20..off];
    // RFC 9293 §3.2: kind 0 ends the list, kind 1 is one byte of padding,
    // every other option has a length byte.
    while let [kind, rest @ ..] = o {
        match *kind {
            0 => break,
            1 => o = rest,
            _ => {
                let Some(&len) = rest.first() else { break };
                let len = usize::from(len);
                if len < 2 || o.len() < len {
                    break;
                }
                match (*kind, len) {
                    (2, 4) => options.mss = u16::from_be_bytes([o[2], o[3]]),
                    (3, 3) => options.wscale = Some(o[2].min(14)),
                    (4, 2) => options.sack_permitted = true,
                    (8, 10) => options.timestamps = true,
                    _ => {}
                }
                o = &o[len..];
            }
        }
    }
    let mut mac = [0; 6];
    mac.copy_from_slice(&frame[6..12]);
    Some(Syn {
        client_mac: Mac(mac),
        client: SocketAddrV4::new(
            Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            u16::from_be_bytes([tcp[0], tcp[1]]),
        ),
        server: SocketAddrV4::new(
            Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            u16::from_be_bytes([tcp[2], tcp[3]]),
        ),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        options,
        frame: frame.to_vec(),
    })
}

/// RFC 1071 checksum (complemented fold) of a running sum.
fn checksum_of(acc: u32) -> u16 {
    !ipv4::fold(acc)
}

/// The RST answering `syn` as if from the server: "connection refused"
/// (RFC 9293 §3.10.7.1: a SYN to a closed port gets RST with ACK of SEQ+1).
pub fn refuse(syn: &Syn, src_mac: Mac) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HEADER + 40);
    f.extend_from_slice(&syn.client_mac.0);
    f.extend_from_slice(&src_mac.0);
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let (src, dst) = (syn.server.ip().octets(), syn.client.ip().octets());
    let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = checksum_of(ipv4::sum(0, &ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut tcp = Vec::with_capacity(20);
    tcp.extend_from_slice(&syn.server.port().to_be_bytes());
    tcp.extend_from_slice(&syn.client.port().to_be_bytes());
    tcp.extend_from_slice(&0u32.to_be_bytes());
    tcp.extend_from_slice(&syn.seq.wrapping_add(1).to_be_bytes());
    tcp.extend_from_slice(&[0x50, RST | ACK, 0, 0, 0, 0, 0, 0]);
    let mut acc = ipv4::sum(0, &src);
    acc = ipv4::sum(acc, &dst);
    acc += 6 + 20;
    let c = checksum_of(ipv4::sum(acc, &tcp));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&tcp);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SYN as Linux sends it: MSS 1460, SACK permitted, timestamps, NOP,
    /// window scale 7.
    fn linux_syn() -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 0xfe, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        let mut ip = vec![
            0x45, 0, 0, 60, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 1, 1, 10, 0, 5, 1,
        ];
        let c = checksum_of(ipv4::sum(0, &ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x9c, 0x40, 0, 80]); // 40000 -> 80
        f.extend_from_slice(&0x1234_5678u32.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 0xa0, SYN, 0xfa, 0xf0, 0, 0, 0, 0]);
        f.extend_from_slice(&[
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ]);
        f
    }

    #[test]
    fn parses_a_linux_syn_and_refuses_it_correctly() {
        let s = parse_syn(&linux_syn()).unwrap();
        assert_eq!(s.client, "10.0.1.1:40000".parse().unwrap());
        assert_eq!(s.server, "10.0.5.1:80".parse().unwrap());
        assert_eq!(s.seq, 0x1234_5678);
        assert_eq!(
            s.options,
            TcpOptions {
                mss: 1460,
                wscale: Some(7),
                sack_permitted: true,
                timestamps: true
            }
        );
        let me = Mac([2, 0, 0, 0, 0, 0xfe]);
        let r = refuse(&s, me);
        assert_eq!(&r[..6], &s.client_mac.0);
        let ip = &r[ETH_HEADER..];
        assert_eq!(
            checksum_of(ipv4::sum(0, &ip[..20])),
            0,
            "IPv4 header checksum"
        );
        let mut acc = ipv4::sum(0, &ip[12..20]);
        acc += 6 + 20;
        assert_eq!(checksum_of(ipv4::sum(acc, &ip[20..])), 0, "TCP checksum");
        assert_eq!(&ip[20..22], &80u16.to_be_bytes());
        assert_eq!(&ip[28..32], &0x1234_5679u32.to_be_bytes());
        assert_eq!(ip[33], RST | ACK);
        // Not SYNs: a SYN-ACK, and truncated frames.
        let mut sa = linux_syn();
        sa[ETH_HEADER + 20 + 13] = SYN | ACK;
        assert!(parse_syn(&sa).is_none());
        assert!(parse_syn(&linux_syn()[..40]).is_none());
    }
}
