//! The proxy's stream header (`quicsdn_proxy::header`): the first bytes a
//! proxy client sends on every stream, read by the proxy server the way its
//! `read_header` does (two bytes, then the name they announce).

use quicsdn_proxy::header::{self, HeaderError};
use quicsdn_wire::preamble::{MAX_SERVICE_NAME, validate_service_name};

/// `fuzz/fuzz_targets/proxy_header.rs`.
pub fn proxy_header(data: &[u8]) {
    let [v, len, rest @ ..] = data else {
        return;
    };
    let prefix = match header::decode_prefix([*v, *len]) {
        Ok(p) => p,
        Err(e) => {
            assert!(matches!(
                e,
                HeaderError::Version(_) | HeaderError::Length(_)
            ));
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert!(prefix.name_len >= 1 && prefix.name_len <= MAX_SERVICE_NAME);
    assert_eq!(prefix.name_len, usize::from(*len));
    // The server waits for exactly name_len bytes; fewer is a stream that
    // ended early (read_exact's error), not a parse.
    let Some(name) = rest.get(..prefix.name_len) else {
        return;
    };
    match header::decode_name(name) {
        Ok(n) => {
            validate_service_name(&n).expect("a decoded name is valid");
            // What the client would send for this forward is these very bytes.
            assert_eq!(header::encode(&n), data[..2 + prefix.name_len]);
        }
        Err(e) => {
            assert!(matches!(e, HeaderError::Name(_)));
            // An error names what was wrong, and quotes the name readably.
            assert!(e.to_string().starts_with("invalid forward name"));
        }
    }
}
