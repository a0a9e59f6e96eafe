//! The bodies of quicsdn's fuzz targets: one function per target, taking the
//! fuzzer's bytes and panicking when a contract is broken.
//!
//! `fuzz/` (cargo-fuzz, nightly, libFuzzer) calls these from its targets; the
//! normal test suite (stable) replays every input kept under
//! `fuzz/regressions/TARGET/` through the same functions, so a crash found once
//! stays fixed without a nightly toolchain (`tests/regressions.rs`).
//!
//! Every target covers a parser that reads bytes from outside the agent:
//!
//! | target | what | from whom |
//! |---|---|---|
//! | `openflow_framer` | OpenFlow header-length framing, at every split | OVS, controllers, the peer agent |
//! | `jsonrpc_framer` | JSON-RPC object framing, at every split, against serde_json | OVSDB peers, the peer agent |
//! | `preamble` | stream preambles and the agents' hello | the peer agent |
//! | `openflow_fields` | the fields the lanes key messages by, and the placement rules | OVS, controllers |
//! | `lanes_roundtrip` | Outbound → lanes delivered in any interleaving → Inbound: exactly once, in the promised order | (structure-aware) |
//! | `lanes_inbound` | the inbound lane merge (fence markers) fed arbitrary lane bytes; the 0-RTT gate | a hostile peer agent |
//! | `udp_packet` | the UDP transport's datagram decoder | anyone who can send a datagram |
//! | `udp_association` | an association fed arbitrary datagrams and time | anyone who can send a datagram |
//! | `udp_reassembly` | two associations over a lossy, reordering, duplicating network: robust delivers every message once, in order, or fails visibly | (structure-aware) |
//! | `emulator_classify` | the lab emulator's frame classifier | the lab's hosts and agents |
//! | `emulator_nat` | the lab emulator's NAT: checksums stay valid, replies map back | the lab's hosts and agents |
//! | `snoop_decode` | `quicsdn snoop`'s OpenFlow and JSON-RPC summaries (`wire::decode`) | OVS, controllers |
//! | `proxy_header` | the proxy's stream header | a proxy client |
//! | `sdudp_msg` | SDUDP's numbered-datagram and hop control messages | hosts and engines on the path |
//! | `sdudp_ipv4` | SDUDP's IPv4/UDP decoder: what parses rebuilds to the same | hosts and engines on the path |
//! | `sdudp_frame` | an SDUDP engine's frame classifier and SYN parser | hosts and engines on the path |

pub mod fields;
pub mod framing;
pub mod lanes;
pub mod preamble;
pub mod sdudp;
pub mod seeds;
pub mod snoop;
pub mod udp;

#[cfg(feature = "proxy")]
pub mod proxy;
#[cfg(feature = "sdudp-engine")]
pub mod sdudp_engine;

#[cfg(feature = "lab")]
pub mod emulator;

/// A target: its name (the fuzz target's and its directories') and its body.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Needs the `lab` feature (the whole lab crate) to build.
    pub lab: bool,
}

/// Every target, in the order `scripts/fuzz` runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "openflow_framer",
        run: framing::openflow_framer,
        lab: false,
    },
    Target {
        name: "jsonrpc_framer",
        run: framing::jsonrpc_framer,
        lab: false,
    },
    Target {
        name: "preamble",
        run: preamble::preamble,
        lab: false,
    },
    Target {
        name: "openflow_fields",
        run: fields::openflow_fields,
        lab: false,
    },
    Target {
        name: "lanes_roundtrip",
        run: lanes::lanes_roundtrip,
        lab: false,
    },
    Target {
        name: "lanes_inbound",
        run: lanes::lanes_inbound,
        lab: false,
    },
    Target {
        name: "udp_packet",
        run: udp::udp_packet,
        lab: false,
    },
    Target {
        name: "udp_association",
        run: udp::udp_association,
        lab: false,
    },
    Target {
        name: "udp_reassembly",
        run: udp::udp_reassembly,
        lab: false,
    },
    Target {
        name: "snoop_decode",
        run: snoop::snoop_decode,
        lab: false,
    },
    #[cfg(feature = "proxy")]
    Target {
        name: "proxy_header",
        run: proxy::proxy_header,
        lab: false,
    },
    Target {
        name: "sdudp_msg",
        run: sdudp::sdudp_msg,
        lab: false,
    },
    Target {
        name: "sdudp_ipv4",
        run: sdudp::sdudp_ipv4,
        lab: false,
    },
    #[cfg(feature = "sdudp-engine")]
    Target {
        name: "sdudp_frame",
        run: sdudp_engine::sdudp_frame,
        lab: false,
    },
    #[cfg(feature = "lab")]
    Target {
        name: "emulator_classify",
        run: emulator::emulator_classify,
        lab: true,
    },
    #[cfg(feature = "lab")]
    Target {
        name: "emulator_nat",
        run: emulator::emulator_nat,
        lab: true,
    },
];

/// A tiny deterministic generator for split points and schedules drawn from
/// the fuzzer's bytes (SplitMix64: the same input always takes the same path).
pub(crate) struct Splits(u64);

impl Splits {
    pub(crate) fn new(seed: &[u8]) -> Splits {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for &b in seed {
            s = (s ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Splits(s)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `1..=max`.
    pub(crate) fn size(&mut self, max: usize) -> usize {
        1 + (self.next() % max.max(1) as u64) as usize
    }
}
