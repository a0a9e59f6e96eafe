//! The stream preambles and the agents' hello: what a peer agent sends first
//! on every stream.

use quicsdn_wire::preamble::{
    Hello, LanePreamble, PreambleError, SessionPreamble, StreamStart, validate_service_name,
};

/// Checks one decoder on `data` and on each of its prefixes: a prefix of a
/// whole preamble is incomplete (`Ok(None)`), never an error or another
/// preamble; a prefix of a malformed one is incomplete or the same error; a
/// longer buffer decodes the same preamble.
fn prefixes<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    decode: impl Fn(&[u8]) -> Result<Option<(T, usize)>, PreambleError>,
) -> Result<Option<(T, usize)>, PreambleError> {
    let whole = decode(data);
    // Every prefix of a short input; of a long one (a hello), the first 128 and
    // the last 16 (the decision points are where the varints and the JSON end).
    let cuts = (0..data.len()).filter(|&c| c < 128 || c + 16 >= data.len());
    for cut in cuts {
        let part = decode(&data[..cut]);
        match (&whole, &part) {
            (Ok(Some((_, n))), Ok(None)) if cut < *n => {}
            (Ok(Some((w, n))), Ok(Some((p, m)))) if cut >= *n && w == p && n == m => {}
            (Ok(None), Ok(None)) => {}
            (Err(_), Ok(None)) => {}
            (Err(w), Err(p)) if w == p => {}
            _ => panic!("prefix of {cut} bytes decodes to {part:?}, the whole to {whole:?}"),
        }
    }
    if let Ok(Some((_, n))) = &whole {
        assert!(*n <= data.len() && *n > 0);
    }
    whole
}

/// `fuzz/fuzz_targets/preamble.rs`.
pub fn preamble(data: &[u8]) {
    // Long inputs only make the prefix loop quadratic; preambles are short,
    // hellos at most 64 KiB, and 4 KiB covers every branch.
    let data = &data[..data.len().min(4096)];
    if let Ok(Some((p, n))) = prefixes(data, SessionPreamble::decode) {
        validate_service_name(&p.service).expect("a decoded service name is valid");
        // Re-encoding may choose shorter varints, but decodes to the same.
        let again = p.encode();
        assert!(again.len() <= n);
        assert_eq!(SessionPreamble::decode(&again), Ok(Some((p, again.len()))));
    }
    if let Ok(Some((l, _))) = prefixes(data, LanePreamble::decode) {
        assert!(l.lane >= 1 && l.lane < quicsdn_wire::preamble::MAX_LANES);
        let again = l.encode();
        assert_eq!(LanePreamble::decode(&again), Ok(Some((l, again.len()))));
    }
    if let Ok(Some((h, _))) = prefixes(data, Hello::decode) {
        let again = h.encode();
        assert_eq!(Hello::decode(&again), Ok(Some((h, again.len()))));
    }
    let start = prefixes(data, StreamStart::decode);
    // The dispatcher agrees with the decoder its first byte names.
    match (data.first(), &start) {
        (Some(0x63), r) => assert_eq!(
            r.clone(),
            Hello::decode(data).map(|o| o.map(|(h, n)| (StreamStart::Control(h), n)))
        ),
        (Some(0x75), r) => assert_eq!(
            r.clone(),
            LanePreamble::decode(data).map(|o| o.map(|(p, n)| (StreamStart::Lane(p), n)))
        ),
        (Some(_), r) => assert_eq!(
            r.clone(),
            SessionPreamble::decode(data).map(|o| o.map(|(p, n)| (StreamStart::Session(p), n)))
        ),
        (None, r) => assert_eq!(r, &Ok(None)),
    }
}
