//! The lab emulator's frame classifier and NAT: every frame a lab host or
//! agent puts on an emulated link passes through them.

use arbitrary::{Arbitrary, Unstructured};
use quicsdn_lab::emulator::nat::Nat;
use quicsdn_lab::emulator::{Class, Classifier, NatSettings, Side};

/// `fuzz/fuzz_targets/emulator_classify.rs`: any bytes classify, and the
/// payload counted is never more than the frame carries.
pub fn emulator_classify(data: &[u8]) {
    let Some((ports, frame)) = data.split_at_checked(6) else {
        return;
    };
    let port = |i: usize| u16::from_be_bytes([ports[i], ports[i + 1]]);
    for c in [
        Classifier::default(),
        Classifier {
            openflow_ports: vec![port(0)],
            ovsdb_port: port(2),
            quic_port: port(4),
        },
    ] {
        let fc = c.classify(frame);
        assert!(fc.payload as usize <= frame.len());
        if !matches!(
            fc.class,
            Class::OpenFlow | Class::Ovsdb | Class::TcpOther | Class::Quic | Class::UdpOther
        ) {
            assert_eq!(fc.payload, 0, "{:?} carries no transport payload", fc.class);
        }
        let _ = c.is_ack_only(frame);
    }
}

/// An IPv4 UDP or TCP frame described by the fuzzer.
#[derive(Arbitrary, Debug)]
struct Frame {
    vlan: bool,
    tcp: bool,
    /// Words of IP options (0–2).
    options: u8,
    fragment: u16,
    src: u8,
    dst: u8,
    sport: u16,
    dport: u16,
    checksum: bool,
    payload: Vec<u8>,
}

const ETH_LEN: usize = 14;

fn ones_sum(bytes: &[u8], mut sum: u32) -> u32 {
    for c in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// The transport checksum over pseudo-header and segment (RFC 768, RFC 9293
/// §3.1), checksum field included: `0xffff` when the checksum is right.
fn transport_sum(ip: &[u8], seg: &[u8]) -> u16 {
    let mut pseudo = ip[12..20].to_vec();
    pseudo.extend_from_slice(&[0, ip[9]]);
    pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    ones_sum(seg, ones_sum(&pseudo, 0)) as u16
}

impl Frame {
    fn build(&self) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        if self.vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let ihl = 5 + usize::from(self.options % 3);
        let payload = &self.payload[..self.payload.len().min(256)];
        let mut seg = Vec::new();
        seg.extend_from_slice(&self.sport.to_be_bytes());
        seg.extend_from_slice(&self.dport.to_be_bytes());
        if self.tcp {
            seg.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        } else {
            seg.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            seg.extend_from_slice(&[0, 0]);
        }
        seg.extend_from_slice(payload);
        let mut ip = vec![(4 << 4) | ihl as u8, 0];
        ip.extend_from_slice(&((ihl * 4 + seg.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 0]);
        ip.extend_from_slice(&(self.fragment & 0x3fff).to_be_bytes());
        ip.extend_from_slice(&[64, if self.tcp { 6 } else { 17 }, 0, 0]);
        ip.extend_from_slice(&[10, 254, 1, self.src % 4]);
        ip.extend_from_slice(&[10, 254, 1, self.dst % 4]);
        ip.resize(ihl * 4, 1); // NOP options
        if self.checksum {
            let at = if self.tcp { 16 } else { 6 };
            let mut c = !transport_sum(&ip, &seg);
            if c == 0 && !self.tcp {
                c = 0xffff;
            }
            seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        f.extend_from_slice(&ip);
        f.extend_from_slice(&seg);
        f
    }
}

#[derive(Arbitrary, Debug)]
enum Packet {
    Built(Frame),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct NatRun {
    first_port: u16,
    packets: Vec<(bool, Packet)>,
}

/// Where a frame's IPv4 header and transport segment are, if it has them whole.
fn ip_and_segment(f: &[u8]) -> Option<(usize, usize, usize)> {
    let off = if f.get(12..14)? == [0x81, 0x00] {
        18
    } else {
        ETH_LEN
    };
    if f.get(off - 2..off)? != [0x08, 0x00] {
        return None;
    }
    let ip = f.get(off..)?;
    let ihl = usize::from(*ip.first()? & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    if *ip.first()? >> 4 != 4 || ihl < 20 || total < ihl || total > ip.len() {
        return None;
    }
    if !matches!(ip[9], 6 | 17) || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let min = if ip[9] == 6 { 20 } else { 8 };
    (total - ihl >= min).then_some((off, off + ihl, off + total))
}

fn checksum_ok(f: &[u8]) -> Option<bool> {
    let (ip, seg, end) = ip_and_segment(f)?;
    let csum_at = seg + if f[ip + 9] == 6 { 16 } else { 6 };
    if f[ip + 9] == 17 && f[csum_at..csum_at + 2] == [0, 0] {
        return None; // no UDP checksum
    }
    Some(transport_sum(&f[ip..seg], &f[seg..end]) == 0xffff)
}

/// `fuzz/fuzz_targets/emulator_nat.rs`: a translated frame changes only in its
/// port and checksum, a valid checksum stays valid, and the reply to a
/// translated packet maps back to the inside port.
pub fn emulator_nat(data: &[u8]) {
    let Ok(run) = NatRun::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let mut nat = Nat::new(NatSettings {
        inside: Side::A,
        first_port: run.first_port,
    });
    for (outbound, p) in run.packets.into_iter().take(256) {
        let before = match p {
            Packet::Built(f) => f.build(),
            Packet::Raw(bytes) => bytes,
        };
        let mut frame = before.clone();
        let valid = checksum_ok(&before);
        let forwarded = if outbound {
            nat.outbound(&mut frame)
        } else {
            nat.inbound(&mut frame)
        };
        assert_eq!(frame.len(), before.len());
        let Some((ip, seg, _)) = ip_and_segment(&before) else {
            // Not a whole IPv4 UDP/TCP packet: only a first fragment's ports may
            // have been read; anything else passes unchanged.
            continue;
        };
        let changed: Vec<usize> = (0..frame.len())
            .filter(|&i| frame[i] != before[i])
            .collect();
        let port_at = if outbound { seg } else { seg + 2 };
        let csum_at = seg + if before[ip + 9] == 6 { 16 } else { 6 };
        for i in &changed {
            assert!(
                (port_at..port_at + 2).contains(i) || (csum_at..csum_at + 2).contains(i),
                "byte {i} changed"
            );
        }
        if !forwarded {
            continue;
        }
        if valid == Some(true) {
            assert_eq!(
                checksum_ok(&frame),
                Some(true),
                "the NAT broke a valid checksum"
            );
        }
        if outbound {
            // The reply, addresses and ports swapped, reaches the inside port.
            let mut reply = frame.clone();
            let (s, d) = (ip + 12, ip + 16);
            for k in 0..4 {
                reply.swap(s + k, d + k);
            }
            for k in 0..2 {
                reply.swap(seg + k, seg + 2 + k);
            }
            assert!(
                nat.inbound(&mut reply),
                "the reply to a translated packet was dropped"
            );
            assert_eq!(
                reply[seg + 2..seg + 4],
                before[seg..seg + 2],
                "the reply lost its port"
            );
        }
    }
}
