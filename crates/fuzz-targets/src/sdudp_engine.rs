//! What an SDUDP engine reads from its switch port
//! (`quicsdn_sdudp_engine::frame::classify`, `tcp::parse_syn`).

use crate::sdudp::{check_ipv4, repaired};
use quicsdn_sdudp::ipv4;
use quicsdn_sdudp_engine::frame::{self, ETH_HEADER, Incoming, Mac, Ports};
use quicsdn_sdudp_engine::tcp;
use std::net::Ipv4Addr;

/// The engine's default ports (`quicsdn-sdudp --data-ports --control-port`).
const PORTS: Ports = Ports {
    data: 49_152..=50_151,
    control: 49_151,
};

/// `fuzz/fuzz_targets/sdudp_frame.rs`: a frame as an engine's switch port
/// delivers it (byte 0 bit 0 repairs its IPv4 header checksum). The engine
/// is given the frame's own destination address, so control messages are
/// reachable. What it classifies as data or control, sent on again by the
/// engine's own frame builders, classifies the same; a SYN parses to what the
/// frame says, and the RST that refuses it is a valid IPv4 packet.
pub fn sdudp_frame(data: &[u8]) {
    let Some((&flags, f)) = data.split_first() else {
        return;
    };
    let f = repaired(flags, f, ETH_HEADER);
    let own_ip = f
        .get(ETH_HEADER + 16..ETH_HEADER + 20)
        .map_or(Ipv4Addr::LOCALHOST, |a| {
            Ipv4Addr::new(a[0], a[1], a[2], a[3])
        });
    let (src, incoming) = frame::classify(&f, own_ip, &PORTS);
    if f.len() >= ETH_HEADER {
        assert_eq!(src.0, f[6..12]);
    }
    let dst = Mac([2, 0, 0, 0, 0, 1]);
    match &incoming {
        Incoming::Data { flow, id, payload } => {
            check_ipv4(&f[ETH_HEADER..]);
            let again = frame::data_frame(dst, src, *flow, *id, payload);
            assert_eq!(frame::classify(&again, own_ip, &PORTS), (src, incoming));
        }
        Incoming::Control(c) => {
            let peer = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
            let again = frame::control_frame((dst, own_ip), (src, peer), PORTS.control, c);
            assert_eq!(frame::classify(&again, own_ip, &PORTS), (src, incoming));
        }
        Incoming::Malformed(why) => assert!(!why.is_empty()),
        Incoming::Other => {}
    }
    if let Some(syn) = tcp::parse_syn(&f) {
        assert_eq!(syn.frame, f);
        assert_eq!(syn.client_mac.0, f[6..12]);
        assert!(syn.options.wscale.is_none_or(|w| w <= 14));
        let rst = tcp::refuse(&syn, dst);
        assert!(tcp::parse_syn(&rst).is_none(), "an RST is no SYN");
        let ip = &rst[ETH_HEADER..ETH_HEADER + ipv4::IPV4_HEADER];
        assert_eq!(ipv4::fold(ipv4::sum(0, ip)), 0xffff, "RST's IPv4 checksum");
        assert_eq!(rst[..6], f[6..12], "the RST goes back to the client");
    }
}
