//! quinn-proto is patched to read a run of PADDING frames as one frame
//! (third_party/quinn-proto/QUICSDN-PATCH.md). quinn pads at the end of a
//! packet, so every handshake in the suite has padding with nothing after it;
//! other QUIC stacks may put it anywhere (RFC 9000 §19.1: "PADDING frames can
//! be used to increase the size of a packet"). Here a client's first
//! Initial packet is opened with the Initial keys (RFC 9001 §5.2), its padding
//! moved in front of its CRYPTO frame, and sealed again: the server must still
//! read the ClientHello after the run and complete the handshake.

mod common;

use quicsdn_transport::quic::QuicOptions;
use rustls::quic::{Keys, Version};
use rustls::{Side, crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256};
use std::time::Instant;

/// The variable-length integer (RFC 9000 §16) at `b[*at]`, advancing `at`.
fn varint(b: &[u8], at: &mut usize) -> u64 {
    let (value, len) = quicsdn_wire::varint::decode(&b[*at..]).expect("a whole varint");
    *at += len;
    value
}

/// The client's first datagram, a single Initial packet, with its padding
/// moved in front of its other frames. Returns the new datagram and how many
/// PADDING bytes it starts with.
fn padding_first(datagram: &[u8]) -> (Vec<u8>, usize) {
    // RFC 9000 §17.2.2: first byte, version, DCID, SCID, token, length, PN.
    assert_eq!(datagram[0] & 0xf0, 0xc0, "not an Initial packet");
    let dcid_len = usize::from(datagram[5]);
    let dcid = &datagram[6..6 + dcid_len];
    let mut at = 6 + dcid_len;
    at += 1 + usize::from(datagram[at]); // SCID
    let token_len = varint(datagram, &mut at) as usize;
    at += token_len;
    let length = varint(datagram, &mut at) as usize;
    let pn_offset = at;
    assert_eq!(
        pn_offset + length,
        datagram.len(),
        "one packet per datagram"
    );

    let suite = TLS13_AES_128_GCM_SHA256.tls13().unwrap();
    let keys = Keys::initial(Version::V1, suite, suite.quic.unwrap(), dcid, Side::Client).local;
    let mut packet = datagram.to_vec();
    // RFC 9001 §5.4.2: the sample starts 4 bytes after the packet number's start.
    let sample: Vec<u8> = packet[pn_offset + 4..pn_offset + 4 + keys.header.sample_len()].to_vec();
    let (head, rest) = packet.split_at_mut(pn_offset);
    keys.header
        .decrypt_in_place(&sample, &mut head[0], &mut rest[..4])
        .unwrap();
    let pn_len = usize::from(packet[0] & 0x03) + 1;
    let pn = packet[pn_offset..pn_offset + pn_len]
        .iter()
        .fold(0u64, |v, b| (v << 8) | u64::from(*b));
    let (header, payload) = packet.split_at_mut(pn_offset + pn_len);
    let plain = keys
        .packet
        .decrypt_in_place(pn, header, payload)
        .unwrap()
        .to_vec();

    // The frames quinn wrote: CRYPTO (0x06), then PADDING (0x00) to the end.
    let mut at = 0;
    while plain[at] != 0 {
        assert_eq!(plain[at], 0x06, "unexpected frame type {:#x}", plain[at]);
        at += 1;
        varint(&plain, &mut at); // offset
        let len = varint(&plain, &mut at) as usize;
        at += len;
    }
    let (frames, padding) = plain.split_at(at);
    assert!(padding.iter().all(|&b| b == 0), "padding is not at the end");
    let mut moved = [padding, frames].concat();

    let header = header.to_vec();
    let tag = keys
        .packet
        .encrypt_in_place(pn, &header, &mut moved)
        .unwrap();
    let mut sealed = [header.as_slice(), &moved, tag.as_ref()].concat();
    let sample: Vec<u8> = sealed[pn_offset + 4..pn_offset + 4 + keys.header.sample_len()].to_vec();
    let (head, rest) = sealed.split_at_mut(pn_offset);
    keys.header
        .encrypt_in_place(&sample, &mut head[0], &mut rest[..pn_len])
        .unwrap();
    (sealed, padding.len())
}

#[test]
fn a_frame_after_a_run_of_padding_is_read() {
    let now = Instant::now();
    let (mut client, mut server) = common::agents(&QuicOptions::default(), now);

    let mut first = client.poll(now);
    assert!(!first.is_empty(), "the client sends its Initial");
    let (moved, padding) = padding_first(&first.remove(0));
    assert!(padding >= 500, "only {padding} bytes of padding");
    server.receive(now, client.addr, &moved);
    assert!(server.conn.is_some(), "the server took the attempt");
    for datagram in first {
        server.receive(now, client.addr, &datagram);
    }

    for _ in 0..20 {
        for d in server.poll(now) {
            client.receive(now, server.addr, &d);
        }
        for d in client.poll(now) {
            server.receive(now, client.addr, &d);
        }
        if client.connected && server.connected {
            break;
        }
    }
    assert!(
        server.connected,
        "the server did not complete the handshake"
    );
    assert!(
        client.connected,
        "the client did not complete the handshake"
    );
    assert!(!server.conn().is_closed() && !client.conn().is_closed());
}
