//! `quicsdn snoop --pcap`: each session written as an ordinary TCP
//! connection (synthesized Ethernet II / IPv4 / TCP), so Wireshark's OpenFlow
//! and OVSDB dissectors and `ovs-ofctl ofp-parse-pcap` read it unchanged.
//!
//! The switch side is the TCP client (`192.0.2.2`, a fresh port per
//! session), the controller side the server (`192.0.2.1` on 6653 for
//! OpenFlow, 6640 for OVSDB), both addresses from RFC 5737's documentation
//! range. A session opens with a three-way handshake (also when snoop
//! attached in its middle: it opens at the first message seen), each message
//! is one segment (split above [`MAX_SEGMENT`]) with sequence and
//! acknowledgment numbers that count every byte each way (RFC 9293 §3.4), and
//! a close is a FIN from each side. Checksums are computed (etherparse).

use anyhow::{Context, Result};
use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapPacket, PcapWriter};
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

/// The largest TCP payload per packet: an IPv4 packet holds at most 65,535
/// bytes with its headers, and the capture's snap length is 65,535 too.
pub const MAX_SEGMENT: usize = 60_000;
pub const SWITCH_IP: [u8; 4] = [192, 0, 2, 2];
pub const CONTROLLER_IP: [u8; 4] = [192, 0, 2, 1];
const SWITCH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 2];
const CONTROLLER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
/// Initial sequence numbers (any value would do: RFC 9293 §3.4.1).
const SWITCH_ISN: u32 = 1_000;
const CONTROLLER_ISN: u32 = 500_000;
/// The switch side's first port, then one more per session.
const FIRST_CLIENT_PORT: u16 = 40_000;
const WINDOW: u16 = 65_535;

/// One synthesized TCP connection.
struct Conn {
    client_port: u16,
    /// Next sequence number of each side.
    switch_seq: u32,
    controller_seq: u32,
}

/// A capture being written.
pub struct PcapTcp<W: Write> {
    writer: PcapWriter<W>,
    server_port: u16,
    conns: HashMap<u64, Conn>,
    next_port: u16,
}

impl<W: Write> PcapTcp<W> {
    /// `server_port`: 6653 for OpenFlow, 6640 for OVSDB.
    pub fn new(out: W, server_port: u16) -> Result<PcapTcp<W>> {
        Ok(PcapTcp {
            writer: PcapWriter::new(out).context("writing the pcap header")?,
            server_port,
            conns: HashMap::new(),
            next_port: FIRST_CLIENT_PORT,
        })
    }

    /// One packet from the switch side (`from_switch`) or the controller side.
    fn packet(
        &mut self,
        t: Duration,
        session: u64,
        from_switch: bool,
        flags: Flags,
        payload: &[u8],
    ) -> Result<()> {
        let c = self.conns.get_mut(&session).expect("open");
        let (seq, ack) = if from_switch {
            (c.switch_seq, c.controller_seq)
        } else {
            (c.controller_seq, c.switch_seq)
        };
        let (src, dst, smac, dmac, sport, dport) = if from_switch {
            (
                SWITCH_IP,
                CONTROLLER_IP,
                SWITCH_MAC,
                CONTROLLER_MAC,
                c.client_port,
                self.server_port,
            )
        } else {
            (
                CONTROLLER_IP,
                SWITCH_IP,
                CONTROLLER_MAC,
                SWITCH_MAC,
                self.server_port,
                c.client_port,
            )
        };
        let mut b = PacketBuilder::ethernet2(smac, dmac)
            .ipv4(src, dst, 64)
            .tcp(sport, dport, seq, WINDOW);
        if flags.syn {
            b = b.syn();
        }
        if flags.fin {
            b = b.fin();
        }
        if !payload.is_empty() {
            b = b.psh();
        }
        // Every segment but the first SYN acknowledges what the peer sent.
        if !(flags.syn && from_switch) {
            b = b.ack(ack);
        }
        let mut frame = Vec::with_capacity(b.size(payload.len()));
        b.write(&mut frame, payload).context("building a packet")?;
        // SYN and FIN take one sequence number each (RFC 9293 §3.4).
        let used = payload.len() as u32 + u32::from(flags.syn) + u32::from(flags.fin);
        if from_switch {
            c.switch_seq = c.switch_seq.wrapping_add(used);
        } else {
            c.controller_seq = c.controller_seq.wrapping_add(used);
        }
        self.writer
            .write_packet(&PcapPacket::new(t, frame.len() as u32, &frame))
            .context("writing a packet")?;
        Ok(())
    }

    /// Opens `session`'s connection (SYN, SYN-ACK, ACK) unless it is open.
    pub fn open(&mut self, session: u64, t: Duration) -> Result<()> {
        if self.conns.contains_key(&session) {
            return Ok(());
        }
        let client_port = self.next_port;
        self.next_port = self.next_port.checked_add(1).unwrap_or(FIRST_CLIENT_PORT);
        self.conns.insert(
            session,
            Conn {
                client_port,
                switch_seq: SWITCH_ISN,
                controller_seq: CONTROLLER_ISN,
            },
        );
        let syn = Flags {
            syn: true,
            fin: false,
        };
        self.packet(t, session, true, syn, &[])?;
        self.packet(t, session, false, syn, &[])?;
        self.packet(t, session, true, Flags::NONE, &[])
    }

    /// One message of `session`, towards the controller (`to_controller`) or
    /// the switch.
    pub fn message(
        &mut self,
        session: u64,
        t: Duration,
        to_controller: bool,
        data: &[u8],
    ) -> Result<()> {
        self.open(session, t)?;
        for segment in data.chunks(MAX_SEGMENT) {
            self.packet(t, session, to_controller, Flags::NONE, segment)?;
        }
        Ok(())
    }

    /// Closes `session`'s connection: FIN from the switch, FIN from the
    /// controller side, the last ACK.
    pub fn close(&mut self, session: u64, t: Duration) -> Result<()> {
        if !self.conns.contains_key(&session) {
            return Ok(());
        }
        let fin = Flags {
            syn: false,
            fin: true,
        };
        self.packet(t, session, true, fin, &[])?;
        self.packet(t, session, false, fin, &[])?;
        self.packet(t, session, true, Flags::NONE, &[])?;
        self.conns.remove(&session);
        Ok(())
    }

    /// Closes every open connection and returns the output.
    pub fn finish(mut self, t: Duration) -> Result<W> {
        let mut open: Vec<u64> = self.conns.keys().copied().collect();
        open.sort();
        for s in open {
            self.close(s, t)?;
        }
        Ok(self.writer.into_writer())
    }
}

#[derive(Clone, Copy)]
struct Flags {
    syn: bool,
    fin: bool,
}

impl Flags {
    const NONE: Flags = Flags {
        syn: false,
        fin: false,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{SlicedPacket, TransportSlice};
    use pcap_file::pcap::PcapReader;

    /// One TCP segment read back.
    #[derive(Debug)]
    struct Seg {
        sport: u16,
        dport: u16,
        seq: u32,
        ack: Option<u32>,
        syn: bool,
        fin: bool,
        payload: Vec<u8>,
        t: Duration,
    }

    fn read_back(bytes: &[u8]) -> Vec<Seg> {
        let mut r = PcapReader::new(bytes).unwrap();
        let mut out = Vec::new();
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            let s = SlicedPacket::from_ethernet(&p.data).unwrap();
            let Some(TransportSlice::Tcp(tcp)) = s.transport else {
                panic!("not TCP")
            };
            out.push(Seg {
                sport: tcp.source_port(),
                dport: tcp.destination_port(),
                seq: tcp.sequence_number(),
                ack: tcp.ack().then(|| tcp.acknowledgment_number()),
                syn: tcp.syn(),
                fin: tcp.fin(),
                payload: tcp.payload().to_vec(),
                t: p.timestamp,
            });
        }
        out
    }

    #[test]
    fn sessions_read_back_as_consistent_tcp_connections() {
        let mut w = PcapTcp::new(Vec::new(), 6653).unwrap();
        let t = Duration::from_micros(1_700_000_000_123_456);
        let hello = quicsdn_wire::openflow::build::hello(1);
        let big = vec![7u8; MAX_SEGMENT + 10];
        w.message(0, t, true, &hello).unwrap();
        w.message(0, t, false, &hello).unwrap();
        w.message(0, t, false, &big).unwrap();
        w.message(1, t, true, b"second").unwrap();
        w.close(0, t).unwrap();
        let segs = read_back(&w.finish(t).unwrap());
        // Session 0: handshake, 1 + 1 + 2 data segments, 3 closing; session
        // 1: handshake, 1 data, 3 closing at finish.
        assert_eq!(segs.len(), 3 + 4 + 3 + 3 + 1 + 3, "{segs:#?}");
        assert!(segs.iter().all(|s| s.t == t));
        let (syn, synack, ack) = (&segs[0], &segs[1], &segs[2]);
        assert!(syn.syn && syn.ack.is_none() && syn.dport == 6653 && syn.sport == 40_000);
        assert!(synack.syn && synack.ack == Some(syn.seq + 1) && synack.sport == 6653);
        assert!(!ack.syn && ack.seq == syn.seq + 1 && ack.ack == Some(synack.seq + 1));
        // Data: the sequence numbers count every byte each way, and each
        // side acknowledges all the other sent.
        let sw = &segs[3];
        assert_eq!(
            (sw.payload.as_slice(), sw.seq),
            (hello.as_slice(), syn.seq + 1)
        );
        let ctl: Vec<&Seg> = segs[4..7].iter().collect();
        assert_eq!(ctl[0].seq, synack.seq + 1);
        assert_eq!(ctl[0].ack, Some(sw.seq + hello.len() as u32));
        assert_eq!(ctl[1].seq, ctl[0].seq + hello.len() as u32);
        assert_eq!(ctl[1].payload.len() + ctl[2].payload.len(), big.len());
        assert_eq!(ctl[2].seq, ctl[1].seq + MAX_SEGMENT as u32);
        // Session 1 rides its own port.
        assert!(segs[7].syn && segs[7].sport == 40_001);
        // Closing: FIN each way, then the last ACK, after everything sent.
        let fins: Vec<&Seg> = segs
            .iter()
            .filter(|s| s.fin && s.sport != 40_001 && s.dport != 40_001)
            .collect();
        assert_eq!(fins.len(), 2);
        assert_eq!(fins[1].seq, ctl[2].seq + ctl[2].payload.len() as u32);
        assert_eq!(fins[1].ack, Some(fins[0].seq + 1));
    }

    #[test]
    fn ovsdb_uses_6640() {
        let mut w = PcapTcp::new(Vec::new(), 6640).unwrap();
        w.message(
            3,
            Duration::ZERO,
            false,
            br#"{"method":"echo","params":[],"id":"echo"}"#,
        )
        .unwrap();
        let segs = read_back(&w.finish(Duration::ZERO).unwrap());
        assert_eq!(segs[0].dport, 6640);
        assert_eq!(segs[3].sport, 6640);
    }
}
