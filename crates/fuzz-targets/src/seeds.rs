//! Seed inputs for every target: real OpenFlow messages from os-ken's test
//! data (`os_ken/tests/packet_data`: messages encoded by LINC, Open vSwitch's
//! libofproto and `ovs-ofctl`; JSON decodes; pcaps with real frames), and
//! messages quicsdn itself builds. `scripts/fuzz` writes them into
//! `fuzz/corpus/TARGET/`; the stable test suite runs every one through its
//! target.

use quicsdn_udp::Profile;
use quicsdn_udp::packet::{self, Packet};
use quicsdn_wire::preamble::{Hello, LanePreamble, Opener, ServiceOffer, SessionPreamble};
use std::path::{Path, PathBuf};

/// os-ken's `tests` directory in the controllers' venv (`scripts/controllers-venv
/// osken`), or `$QUICSDN_OSKEN_TESTS`.
pub fn osken_tests(repo: &Path) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("QUICSDN_OSKEN_TESTS") {
        return Some(dir.into());
    }
    let lib = repo.join(".venv/osken/lib");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|python| {
        let dir = python.path().join("site-packages/os_ken/tests");
        dir.join("packet_data").is_dir().then_some(dir)
    })
}

fn files(dir: &Path, ext: &str) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            out.extend(files(&p, ext));
        } else if p.extension().is_some_and(|e| e == ext)
            && let Ok(b) = std::fs::read(&p)
        {
            out.push(b);
        }
    }
    out
}

/// The frames of a classic pcap file (either byte order).
fn pcap_frames(pcap: &[u8]) -> Vec<Vec<u8>> {
    let Some(magic) = pcap.get(..4) else {
        return vec![];
    };
    let le = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] => false,
        _ => return vec![],
    };
    let u32_at = |at: usize| -> Option<usize> {
        let b: [u8; 4] = pcap.get(at..at + 4)?.try_into().ok()?;
        Some(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        } as usize)
    };
    let mut out = Vec::new();
    let mut at = 24;
    while let Some(len) = u32_at(at + 8) {
        let Some(frame) = pcap.get(at + 16..at + 16 + len) else {
            break;
        };
        out.push(frame.to_vec());
        at += 16 + len;
    }
    out
}

fn hello() -> Hello {
    Hello {
        agent: "quicsdn 0.1.0".into(),
        services: vec![
            ServiceOffer {
                name: "openflow".into(),
                framing: "openflow".into(),
                opener: Opener::Switch,
            },
            ServiceOffer {
                name: "ovsdb".into(),
                framing: "jsonrpc".into(),
                opener: Opener::Controller,
            },
        ],
        streams: "safe".into(),
    }
}

const JSONRPC: &[&str] = &[
    r#"{"id":0,"method":"echo","params":[]}"#,
    r#"{"id":"echo","result":[],"error":null}"#,
    r#"{"method":"transact","params":["Open_vSwitch",{"op":"select","table":"Bridge","where":[]}],"id":1}"#,
    r#"{"method":"monitor_cond","params":["Open_vSwitch",["monid","Open_vSwitch"],{"Port":[{"columns":["name","interfaces"]}]}],"id":2}"#,
    r#"{"s":"}{][ \" \\ \/ \b\f\n\r\t \u00e9\uD83D\uDE00","n":[-0,1.5e-3,2E+10,true,false,null]}"#,
];

/// Every seed, as `(target, bytes)`. `osken` is os-ken's `tests` directory.
pub fn seeds(osken: Option<&Path>) -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let openflow = osken
        .map(|d| files(&d.join("packet_data"), "packet"))
        .unwrap_or_default();
    let json = osken
        .map(|d| files(&d.join("unit/ofproto/json"), "json"))
        .unwrap_or_default();
    let frames: Vec<Vec<u8>> = osken
        .map(|d| files(&d.join("packet_data/pcap"), "pcap"))
        .unwrap_or_default()
        .iter()
        .flat_map(|p| pcap_frames(p))
        .collect();

    // Framers: 3 bytes of configuration (split seed, size limit), then a stream.
    for (i, chunk) in openflow.chunks(8).enumerate() {
        let mut s = vec![i as u8, 0xff, 0xff];
        s.extend(chunk.concat());
        out.push(("openflow_framer", s));
    }
    for m in &openflow {
        let mut s = vec![0, 0xff, 0xff];
        s.extend_from_slice(m);
        out.push(("openflow_fields", s));
        out.push(("lanes_inbound", m.clone()));
    }
    for (i, chunk) in json.chunks(4).enumerate() {
        let mut s = vec![i as u8, 0xff, 0xff];
        for j in chunk {
            // os-ken's decodes are objects, one per file: a JSON-RPC-like stream.
            s.extend_from_slice(j.trim_ascii());
            s.push(b'\n');
        }
        out.push(("jsonrpc_framer", s));
    }
    let mut s = vec![7, 0x10, 0x00];
    s.extend(JSONRPC.concat().into_bytes());
    out.push(("jsonrpc_framer", s));

    // Preambles and hello.
    out.push((
        "preamble",
        SessionPreamble {
            session: 1,
            mode: (2, 8),
            service: "openflow".into(),
        }
        .encode(),
    ));
    out.push((
        "preamble",
        LanePreamble {
            session: 70_000,
            opened_by_sender: true,
            lane: 9,
        }
        .encode(),
    ));
    out.push(("preamble", hello().encode()));

    // UDP datagrams of every type.
    let id = 0x5157_0017;
    for p in [
        Packet::Hello {
            profile: Profile::Robust,
            hello: br#"{"switch":"sw1"}"#,
        },
        Packet::HelloAck {
            profile: Profile::Seed,
            hello: b"{}",
        },
        Packet::Data {
            channel: 1,
            seq: 1,
            first: true,
            last: true,
            kind: quicsdn_udp::MessageKind::Data,
            payload: openflow
                .first()
                .map_or(&b"\x04\0\0\x08\0\0\0\x01"[..], Vec::as_slice),
        },
        Packet::Ack {
            channel: 1,
            cumulative: 3,
            window: 1024,
            ranges: vec![(5, 7), (9, 10)],
        },
        Packet::Ping { reply: true },
        Packet::Close {
            code: 2,
            reason: "gave up".into(),
        },
    ] {
        out.push(("udp_packet", packet::encode(id, &p)));
    }

    // Frames: 6 bytes of ports, then the frame.
    for f in &frames {
        let mut s = vec![0x19, 0xfd, 0x19, 0xf8, 0x19, 0xfd];
        s.extend_from_slice(f);
        out.push(("emulator_classify", s));
        out.push(("emulator_nat", f.clone()));
    }

    // Structure-aware targets read fields from any bytes: give them a few
    // shapes to start from.
    for target in [
        "lanes_roundtrip",
        "lanes_inbound",
        "udp_association",
        "udp_reassembly",
        "emulator_nat",
    ] {
        for len in [16usize, 64, 256, 1024] {
            let bytes = (0..len).map(|i| (i * 37 + len) as u8).collect();
            out.push((target, bytes));
        }
    }
    for chunk in openflow.chunks(16) {
        out.push(("lanes_roundtrip", chunk.concat()));
    }

    // What `quicsdn snoop` prints: every real OpenFlow message, and JSON-RPC.
    for m in &openflow {
        out.push(("snoop_decode", m.clone()));
    }
    for j in JSONRPC {
        out.push(("snoop_decode", j.as_bytes().to_vec()));
    }
    out.push((
        "snoop_decode",
        quicsdn_wire::openflow::build::echo_request(7, b"soak"),
    ));
    #[cfg(feature = "proxy")]
    for name in ["openflow", "web-1.x", "ovsdb"] {
        let mut h = quicsdn_proxy::header::encode(name);
        h.extend_from_slice(b"GET / HTTP/1.1\r\n");
        out.push(("proxy_header", h));
    }
    sdudp_seeds(&mut out, &frames);
    out
}

/// SDUDP: every message and control message type, as bare messages, as
/// IPv4/UDP datagrams (byte 0: repair the header checksum) and as frames.
fn sdudp_seeds(out: &mut Vec<(&'static str, Vec<u8>)>, frames: &[Vec<u8>]) {
    use quicsdn_sdudp::ipv4::{self, UdpHeader};
    use quicsdn_sdudp::msg::RefuseReason;
    use quicsdn_sdudp::{Control, Direction, FailReason, FlowKey, Message, TcpOptions};
    use std::net::{Ipv4Addr, SocketAddrV4};

    let flow = FlowKey {
        src: Ipv4Addr::new(10, 0, 1, 254),
        dst: Ipv4Addr::new(10, 0, 5, 254),
        sport: 49_160,
        dport: 49_161,
    };
    let options = TcpOptions {
        mss: 1460,
        wscale: Some(7),
        sack_permitted: true,
        timestamps: true,
    };
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), 40_000);
    let server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 5, 1), 80);
    let messages = [
        Message::Data(bytes::Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n")),
        Message::Open {
            client,
            server,
            client_mac: [2, 0, 0, 0, 1, 1],
            options,
        },
        Message::Accept {
            server_mac: [2, 0, 0, 0, 5, 1],
            options,
        },
        Message::Refuse(RefuseReason::Refused),
        Message::Refuse(RefuseReason::Unreachable),
        Message::Fin,
        Message::Reset,
    ];
    let controls = [
        Control::Feedback {
            flow,
            cum: 17,
            limit: 81,
            beyond: 4,
            missing: vec![(20, 3), (30, 1)],
        },
        Control::Probe { flow, next: 65_535 },
        Control::Fail {
            flow,
            toward: Direction::Upstream,
            reason: FailReason::NoRoom,
        },
    ];
    for (i, m) in messages.iter().enumerate() {
        let m = m.encode();
        out.push(("sdudp_msg", m.to_vec()));
        let mut d = vec![0];
        d.extend(ipv4::build(&UdpHeader::for_flow(flow, i as u16), &m));
        out.push(("sdudp_ipv4", d));
    }
    for c in &controls {
        out.push(("sdudp_msg", c.encode().to_vec()));
    }
    #[cfg(feature = "sdudp-engine")]
    {
        use quicsdn_sdudp_engine::frame::{self, Mac};
        let (a, b) = (Mac([2, 0, 0, 0, 0, 0xfe]), Mac([2, 0, 0, 0, 0, 0xfd]));
        let mut push = |f: Vec<u8>| {
            let mut s = vec![0];
            s.extend(f);
            out.push(("sdudp_frame", s));
        };
        for (i, m) in messages.iter().enumerate() {
            push(frame::data_frame(
                a,
                b,
                flow,
                65_530u16.wrapping_add(i as u16),
                &m.encode(),
            ));
        }
        for c in &controls {
            push(frame::control_frame(
                (a, flow.dst),
                (b, flow.src),
                49_151,
                c,
            ));
        }
        // A SYN as Linux sends it (MSS, SACK permitted, timestamps, window
        // scale), checksum repaired by the target (byte 0 = 1).
        let mut syn = vec![1, 2, 0, 0, 0, 0, 0xfe, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        syn.extend([
            0x45, 0, 0, 60, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 1, 1, 10, 0, 5, 1,
        ]);
        syn.extend([0x9c, 0x40, 0, 80, 0x12, 0x34, 0x56, 0x78]);
        syn.extend([0, 0, 0, 0, 0xa0, 0x02, 0xfa, 0xf0, 0, 0, 0, 0]);
        syn.extend([
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ]);
        out.push(("sdudp_frame", syn));
        // Real frames (ARP, ICMP, TCP, UDP) from os-ken's captures.
        for f in frames {
            let mut s = vec![0];
            s.extend_from_slice(f);
            out.push(("sdudp_frame", s));
        }
    }
    #[cfg(not(feature = "sdudp-engine"))]
    let _ = frames;
}
