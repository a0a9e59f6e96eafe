//! The header that opens each proxied stream (sans-IO).
//!
//! The proxy client opens one bidirectional QUIC stream per accepted TCP
//! connection and writes, before any of the connection's bytes:
//!
//! ```text
//! version (1 byte, = 1) | name length (1 byte, 1..=64) | forward name (ASCII)
//! ```
//!
//! Everything after it, in both directions, is the TCP connection's byte
//! stream, unchanged. The server answers nothing first: a refused target is
//! reported by resetting the stream (see [`crate::code`]), so the first byte
//! of a reply costs no extra round trip.

use quicsdn_wire::preamble::{MAX_SERVICE_NAME, validate_service_name};

pub const VERSION: u8 = 1;

/// The header for forward `name` (a name [`crate::Forward::parse`] accepted).
pub fn encode(name: &str) -> Vec<u8> {
    debug_assert!(validate_service_name(name).is_ok());
    let mut out = Vec::with_capacity(2 + name.len());
    out.push(VERSION);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// What a header's first two bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// Bytes of name that follow.
    pub name_len: usize,
}

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("unsupported proxy stream version {0} (this proxy speaks {VERSION})")]
    Version(u8),
    #[error("forward name length {0} is outside 1..={MAX_SERVICE_NAME}")]
    Length(u8),
    #[error("invalid forward name: {0}")]
    Name(String),
}

/// Checks the first two bytes.
pub fn decode_prefix(prefix: [u8; 2]) -> Result<Prefix, HeaderError> {
    if prefix[0] != VERSION {
        return Err(HeaderError::Version(prefix[0]));
    }
    let len = prefix[1];
    if len == 0 || len as usize > MAX_SERVICE_NAME {
        return Err(HeaderError::Length(len));
    }
    Ok(Prefix {
        name_len: len as usize,
    })
}

/// Checks the name bytes.
pub fn decode_name(name: &[u8]) -> Result<String, HeaderError> {
    let name = std::str::from_utf8(name).map_err(|_| {
        HeaderError::Name(format!("{:?} is not ASCII", String::from_utf8_lossy(name)))
    })?;
    validate_service_name(name).map_err(|e| HeaderError::Name(e.to_string()))?;
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = encode("web-1.x");
        let p = decode_prefix([h[0], h[1]]).unwrap();
        assert_eq!(p.name_len, 7);
        assert_eq!(decode_name(&h[2..]).unwrap(), "web-1.x");
    }

    #[test]
    fn bad_headers_are_named() {
        assert_eq!(decode_prefix([2, 3]), Err(HeaderError::Version(2)));
        assert_eq!(decode_prefix([1, 0]), Err(HeaderError::Length(0)));
        assert_eq!(decode_prefix([1, 65]), Err(HeaderError::Length(65)));
        assert!(
            decode_name(b"a/b")
                .unwrap_err()
                .to_string()
                .contains("letters")
        );
        assert!(decode_name(&[0xff]).is_err());
    }
}
