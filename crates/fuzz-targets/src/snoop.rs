//! `quicsdn snoop`'s decoder (`quicsdn_wire::decode`): it prints whatever a
//! switch or controller sent, so it reads arbitrary bytes and must summarise
//! every one of them, malformed or truncated, without a panic.

use quicsdn_wire::decode::{self, Detail};
use quicsdn_wire::openflow::{HEADER_LEN, Header};

/// Summarises `msg` and checks what the summary says against the bytes.
fn check_openflow(msg: &[u8]) {
    let line = decode::openflow_line(msg);
    let Some(s) = decode::openflow(msg) else {
        assert!(msg.len() < HEADER_LEN, "a whole header gave no summary");
        assert!(line.starts_with("MALFORMED"), "{line}");
        return;
    };
    assert!(msg.len() >= HEADER_LEN);
    let h = Header::parse(msg).expect("a header");
    assert_eq!((s.version, s.xid, s.length), (h.version, h.xid, msg.len()));
    assert_eq!(line, s.to_string());
    if usize::from(h.length) != msg.len() {
        assert!(
            matches!(s.detail, Detail::Malformed(_)),
            "length {} of {} bytes not called malformed: {line}",
            h.length,
            msg.len()
        );
    }
}

/// `fuzz/fuzz_targets/snoop_decode.rs`: the input as one OpenFlow message,
/// and again with its header's length made to agree (so the body decoders,
/// not the length check, see the bytes); and as one JSON-RPC message.
pub fn snoop_decode(data: &[u8]) {
    check_openflow(data);
    if data.len() >= HEADER_LEN && data.len() <= usize::from(u16::MAX) {
        let mut m = data.to_vec();
        m[2..4].copy_from_slice(&(data.len() as u16).to_be_bytes());
        check_openflow(&m);
        // Every truncation of a consistent message, with its length fixed too:
        // body fields cut anywhere.
        for cut in (HEADER_LEN..m.len()).rev().take(64) {
            let mut t = m[..cut].to_vec();
            t[2..4].copy_from_slice(&(cut as u16).to_be_bytes());
            check_openflow(&t);
        }
    }
    let line = decode::jsonrpc_line(data);
    match decode::jsonrpc(data) {
        Ok(j) => {
            let v: serde_json::Value = serde_json::from_slice(data).expect("serde_json agrees");
            assert!(v.is_object());
            assert_eq!(j.length, data.len());
            assert_eq!(line, j.to_string());
        }
        Err(_) => assert!(line.starts_with("MALFORMED JSON-RPC"), "{line}"),
    }
}
