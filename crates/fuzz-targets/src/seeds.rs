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
    out
}
