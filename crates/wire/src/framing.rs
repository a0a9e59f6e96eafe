//! Message framing: finding where each message of a byte stream ends.
//!
//! A [`Framer`] is a pure state machine. The caller keeps the bytes; the framer
//! only says how long the next whole message at the front of the buffer is:
//!
//! ```
//! use quicsdn_wire::{Framer, Framing};
//! let mut framer = Framer::new(Framing::OpenFlow, 65_535);
//! let hello = [4u8, 0, 0, 8, 0, 0, 0, 1];
//! assert_eq!(framer.next_message(&hello[..5]).unwrap(), None); // split: wait
//! assert_eq!(framer.next_message(&hello).unwrap(), Some(8)); // whole
//! ```
//!
//! Contract: after `Ok(Some(n))` the caller removes exactly `n` bytes from the front
//! of its buffer before calling again, and otherwise only ever appends to it. The
//! JSON framer remembers how far it has scanned, so feeding a large message a byte
//! at a time costs linear, not quadratic, time. After an error the stream is
//! unusable: the caller closes that one connection.

use crate::openflow;

/// How a service's byte stream divides into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// OpenFlow: every message starts with an 8-byte header holding its length.
    OpenFlow,
    /// JSON-RPC as Open vSwitch speaks it (RFC 7047 §4): JSON objects back to back,
    /// optionally separated by white space.
    JsonRpc,
    /// No message structure: bytes are forwarded as they arrive.
    Raw,
}

impl Framing {
    /// Framing names used in configuration (`openflow`, `jsonrpc`, `raw`; `ovsdb` is
    /// accepted for `jsonrpc`).
    pub fn parse(name: &str) -> Option<Framing> {
        match name {
            "openflow" => Some(Framing::OpenFlow),
            "jsonrpc" | "ovsdb" => Some(Framing::JsonRpc),
            "raw" => Some(Framing::Raw),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Framing::OpenFlow => "openflow",
            Framing::JsonRpc => "jsonrpc",
            Framing::Raw => "raw",
        }
    }

    /// True when message boundaries are known, so messages may be spread over
    /// several streams and merged back whole.
    pub fn has_boundaries(self) -> bool {
        !matches!(self, Framing::Raw)
    }
}

/// Why a byte stream is not a valid sequence of messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(
        "OpenFlow message (version {version:#04x}, type {msg_type}, xid {xid:#x}) declares length {length}, less than the 8-byte header"
    )]
    OpenFlowLengthTooShort {
        version: u8,
        msg_type: u8,
        xid: u32,
        length: u16,
    },
    #[error(
        "OpenFlow message (type {msg_type}, xid {xid:#x}) has version 0, which is no OpenFlow version (quicsdn reserves it for its stream markers)"
    )]
    OpenFlowVersionZero { msg_type: u8, xid: u32 },
    #[error("message of {length} bytes exceeds the {limit}-byte limit")]
    TooLarge { length: usize, limit: usize },
    #[error("invalid JSON at byte {offset} of the message: found {found}, expected {expected}")]
    Json {
        offset: usize,
        found: String,
        expected: &'static str,
    },
}

/// Splits a byte stream into messages; see the module documentation for the contract.
#[derive(Debug, Clone)]
pub struct Framer {
    framing: Framing,
    max_message: usize,
    json: JsonScanner,
}

impl Framer {
    /// A framer that rejects messages longer than `max_message` bytes. OpenFlow
    /// messages are additionally bounded by their 16-bit length field.
    pub fn new(framing: Framing, max_message: usize) -> Framer {
        Framer {
            framing,
            max_message,
            json: JsonScanner::default(),
        }
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The length of the whole message at the front of `buf`, `None` if more bytes
    /// are needed, or the reason the stream is malformed.
    pub fn next_message(&mut self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        match self.framing {
            Framing::OpenFlow => self.next_openflow(buf),
            Framing::JsonRpc => self.json.next_message(buf, self.max_message),
            Framing::Raw => Ok((!buf.is_empty()).then_some(buf.len())),
        }
    }

    /// True when `leftover` (bytes still buffered when the stream ended) holds part of a
    /// message, as opposed to nothing or only white space between JSON messages.
    pub fn is_partial(&self, leftover: &[u8]) -> bool {
        match self.framing {
            Framing::JsonRpc => leftover.iter().any(|b| !is_json_space(*b)),
            _ => !leftover.is_empty(),
        }
    }

    fn next_openflow(&mut self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        let Some(header) = openflow::Header::parse(buf) else {
            return Ok(None);
        };
        let length = usize::from(header.length);
        if length < openflow::HEADER_LEN {
            return Err(FrameError::OpenFlowLengthTooShort {
                version: header.version,
                msg_type: header.msg_type,
                xid: header.xid,
                length: header.length,
            });
        }
        if length > self.max_message {
            return Err(FrameError::TooLarge {
                length,
                limit: self.max_message,
            });
        }
        Ok((buf.len() >= length).then_some(length))
    }
}

fn is_json_space(b: u8) -> bool {
    // RFC 8259 §2: ws = *( %x20 / %x09 / %x0A / %x0D )
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Where the scanner is in the JSON grammar (RFC 8259 §2–§7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum JsonState {
    /// Skipping white space before a message; only `{` may start one, since a
    /// JSON-RPC message is an object (RFC 7047 §4 and JSON-RPC 1.0).
    #[default]
    BeforeMessage,
    /// After `{`: a member name or `}`.
    KeyOrObjectEnd,
    /// After `,` inside an object: a member name.
    Key,
    /// After a member name: `:`.
    Colon,
    /// After `[`: a value or `]`.
    ValueOrArrayEnd,
    /// After `:` or `,` inside an array: a value.
    Value,
    /// After a complete value: `,` or the closing bracket of the enclosing container.
    AfterValue,
    String {
        key: bool,
    },
    StringEscape {
        key: bool,
    },
    StringUnicode {
        key: bool,
        hex_left: u8,
    },
    Number(NumberState),
    /// Inside `true`, `false` or `null`: the bytes still expected.
    Literal {
        rest: &'static [u8],
    },
}

/// RFC 8259 §6: number = [ minus ] int [ frac ] [ exp ].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumberState {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    ExpMark,
    ExpSign,
    Exp,
}

impl NumberState {
    /// True when the number may end here.
    fn complete(self) -> bool {
        matches!(
            self,
            NumberState::Zero | NumberState::Int | NumberState::Frac | NumberState::Exp
        )
    }

    fn step(self, b: u8) -> Option<NumberState> {
        use NumberState::*;
        Some(match (self, b) {
            (Minus, b'0') => Zero,
            (Minus, b'1'..=b'9') => Int,
            (Int, b'0'..=b'9') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => ExpMark,
            (ExpMark, b'+' | b'-') => ExpSign,
            (ExpMark | ExpSign | Exp, b'0'..=b'9') => Exp,
            _ => return None,
        })
    }
}

/// An incremental, non-recursive JSON validator that finds where each top-level
/// object ends. Nesting depth is limited only by the message size limit, since the
/// container stack grows by one entry per opening bracket.
#[derive(Debug, Clone, Default)]
struct JsonScanner {
    state: JsonState,
    /// Bytes of the current message already scanned, white space before it included.
    scanned: usize,
    /// Offset of the message's opening `{` (white space before it does not count
    /// towards the size limit).
    start: usize,
    /// Open containers: `true` for an object, `false` for an array.
    stack: Vec<bool>,
}

impl JsonScanner {
    fn next_message(&mut self, buf: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
        while self.scanned < buf.len() {
            let b = buf[self.scanned];
            let offset = self.scanned;
            self.scanned += 1;
            let closed = self.step(b, offset)?;
            // The limit holds for the closing byte too (a message of limit + 1
            // bytes once passed: found by the jsonrpc_framer fuzz target's oracle,
            // fuzz/regressions/jsonrpc_framer).
            if self.state != JsonState::BeforeMessage && self.scanned - self.start > max {
                return Err(FrameError::TooLarge {
                    length: self.scanned - self.start,
                    limit: max,
                });
            }
            if closed {
                let len = self.scanned;
                *self = JsonScanner {
                    stack: std::mem::take(&mut self.stack),
                    ..JsonScanner::default()
                };
                return Ok(Some(len));
            }
            if self.state == JsonState::BeforeMessage {
                self.start = self.scanned;
            }
        }
        Ok(None)
    }

    /// Consumes one byte; true when it closed the top-level object.
    fn step(&mut self, b: u8, offset: usize) -> Result<bool, FrameError> {
        use JsonState::*;
        let err = |expected: &'static str| FrameError::Json {
            offset,
            found: describe_byte(b),
            expected,
        };
        match self.state {
            BeforeMessage => match b {
                b'{' => self.open(true),
                _ if is_json_space(b) => {}
                _ => return Err(err("'{' to start a JSON-RPC message")),
            },
            KeyOrObjectEnd | Key => match b {
                b'"' => self.state = String { key: true },
                b'}' if self.state == KeyOrObjectEnd => return Ok(self.close()),
                _ if is_json_space(b) => {}
                _ if self.state == KeyOrObjectEnd => return Err(err("a member name or '}'")),
                _ => return Err(err("a member name")),
            },
            Colon => match b {
                b':' => self.state = Value,
                _ if is_json_space(b) => {}
                _ => return Err(err("':'")),
            },
            ValueOrArrayEnd if b == b']' => return Ok(self.close()),
            ValueOrArrayEnd | Value => {
                if !is_json_space(b) {
                    self.start_value(b).map_err(|()| err("a JSON value"))?;
                }
            }
            AfterValue => match b {
                b',' => {
                    self.state = if self.in_object() { Key } else { Value };
                }
                b'}' if self.in_object() => return Ok(self.close()),
                b']' if !self.in_object() => return Ok(self.close()),
                _ if is_json_space(b) => {}
                _ if self.in_object() => return Err(err("',' or '}'")),
                _ => return Err(err("',' or ']'")),
            },
            String { key } => match b {
                b'"' => self.state = if key { Colon } else { AfterValue },
                b'\\' => self.state = StringEscape { key },
                // RFC 8259 §7: control characters U+0000..U+001F must be escaped.
                0x00..=0x1f => return Err(err("an escaped control character")),
                _ => {}
            },
            StringEscape { key } => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    self.state = String { key };
                }
                b'u' => self.state = StringUnicode { key, hex_left: 4 },
                _ => return Err(err("an escape character")),
            },
            StringUnicode { key, hex_left } => {
                if !b.is_ascii_hexdigit() {
                    return Err(err("a hexadecimal digit"));
                }
                self.state = if hex_left == 1 {
                    String { key }
                } else {
                    StringUnicode {
                        key,
                        hex_left: hex_left - 1,
                    }
                };
            }
            Number(n) => match n.step(b) {
                Some(next) => self.state = Number(next),
                None if n.complete() => {
                    // The byte after a number belongs to what follows the value.
                    self.state = AfterValue;
                    return self.step(b, offset);
                }
                None => return Err(err("a digit")),
            },
            Literal { rest } => {
                if b != rest[0] {
                    return Err(err("the rest of true, false or null"));
                }
                self.state = if rest.len() == 1 {
                    AfterValue
                } else {
                    Literal { rest: &rest[1..] }
                };
            }
        }
        Ok(false)
    }

    fn start_value(&mut self, b: u8) -> Result<(), ()> {
        self.state = match b {
            b'{' => {
                self.open(true);
                return Ok(());
            }
            b'[' => {
                self.open(false);
                return Ok(());
            }
            b'"' => JsonState::String { key: false },
            b'-' => JsonState::Number(NumberState::Minus),
            b'0' => JsonState::Number(NumberState::Zero),
            b'1'..=b'9' => JsonState::Number(NumberState::Int),
            b't' => JsonState::Literal { rest: b"rue" },
            b'f' => JsonState::Literal { rest: b"alse" },
            b'n' => JsonState::Literal { rest: b"ull" },
            _ => return Err(()),
        };
        Ok(())
    }

    fn in_object(&self) -> bool {
        self.stack.last().copied().unwrap_or(false)
    }

    fn open(&mut self, object: bool) {
        self.stack.push(object);
        self.state = if object {
            JsonState::KeyOrObjectEnd
        } else {
            JsonState::ValueOrArrayEnd
        };
    }

    /// Closes the innermost container; true when that was the top-level object.
    fn close(&mut self) -> bool {
        self.stack.pop();
        self.state = JsonState::AfterValue;
        self.stack.is_empty()
    }
}

fn describe_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        format!("byte {b:#04x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openflow::{self, OFP10_VERSION, OFP13_VERSION, OFP15_VERSION};

    /// Feeds `stream` to a fresh framer split in two at every byte, and in one-byte
    /// steps, and checks each way yields exactly `expected` (the message lengths).
    /// The framer's buffer is always `stream[consumed..fed]`, so no bytes are copied.
    fn assert_frames_at_every_split(
        framing: Framing,
        max: usize,
        stream: &[u8],
        expected: &[usize],
    ) {
        let mut splits: Vec<Vec<usize>> = (0..=stream.len())
            .map(|cut| vec![cut, stream.len()])
            .collect();
        splits.push((1..=stream.len()).collect());
        for cuts in splits {
            let mut framer = Framer::new(framing, max);
            let mut consumed = 0;
            let mut got = Vec::new();
            for fed in cuts {
                while let Some(n) = framer
                    .next_message(&stream[consumed..fed])
                    .expect("valid stream")
                {
                    got.push(n);
                    consumed += n;
                }
            }
            assert_eq!(got, expected, "framing {framing:?}");
            assert!(
                !framer.is_partial(&stream[consumed..]),
                "leftover {:?}",
                &stream[consumed..]
            );
        }
    }

    fn openflow_stream() -> (Vec<u8>, Vec<usize>) {
        let messages = [
            openflow::message(OFP10_VERSION, 0, 1, &[]), // HELLO 1.0
            openflow::message(OFP13_VERSION, 0, 2, &[0, 1, 0, 8, 0, 0, 0, 0x10]), // HELLO 1.3 with bitmap
            openflow::message(OFP15_VERSION, 2, 3, b"ping"), // ECHO_REQUEST 1.5
            openflow::message(OFP13_VERSION, 14, 4, &[0xab; 48]), // FLOW_MOD-sized body
        ];
        let lens = messages.iter().map(Vec::len).collect();
        (messages.concat(), lens)
    }

    #[test]
    fn openflow_messages_of_every_version_at_every_split() {
        let (stream, lens) = openflow_stream();
        assert_frames_at_every_split(Framing::OpenFlow, openflow::MAX_MESSAGE_LEN, &stream, &lens);
    }

    #[test]
    fn openflow_65535_byte_multipart_reply() {
        let body = vec![0x5a; openflow::MAX_MESSAGE_LEN - openflow::HEADER_LEN];
        let big = openflow::message(OFP13_VERSION, 19, 7, &body);
        assert_eq!(big.len(), 65_535);
        let hello = openflow::message(OFP13_VERSION, 0, 8, &[]);
        let stream = [hello.clone(), big.clone(), hello.clone()].concat();
        assert_frames_at_every_split(
            Framing::OpenFlow,
            openflow::MAX_MESSAGE_LEN,
            &stream,
            &[8, 65_535, 8],
        );
    }

    #[test]
    fn openflow_length_below_header_is_malformed() {
        let mut framer = Framer::new(Framing::OpenFlow, 65_535);
        for length in 0..8u16 {
            let h = openflow::Header {
                version: OFP13_VERSION,
                msg_type: 0,
                length,
                xid: 9,
            };
            let err = framer.next_message(&h.encode()).unwrap_err();
            assert!(
                matches!(err, FrameError::OpenFlowLengthTooShort { length: l, .. } if l == length)
            );
            assert!(
                err.to_string().contains("less than the 8-byte header"),
                "{err}"
            );
        }
    }

    #[test]
    fn openflow_over_configured_limit_is_malformed_before_the_body_arrives() {
        let mut framer = Framer::new(Framing::OpenFlow, 1000);
        let msg = openflow::message(OFP13_VERSION, 19, 1, &[0; 1200]);
        let err = framer.next_message(&msg[..8]).unwrap_err();
        assert_eq!(
            err,
            FrameError::TooLarge {
                length: 1208,
                limit: 1000
            }
        );
    }

    const JSON_MESSAGES: &[&str] = &[
        r#"{"id":0,"method":"echo","params":[]}"#,
        r#"{"method":"transact","params":["Open_vSwitch",{"op":"select","table":"Bridge","where":[]}],"id":1}"#,
        // Braces and brackets inside strings, every escape, unicode escapes.
        r#"{"s":"}{][ \" \\ \/ \b\f\n\r\t \u00e9\uD83D\uDE00 {\"x\":1}","k\"}":"v"}"#,
        // Deep nesting and every value type.
        r#"{"a":[[[[{"b":[true,false,null,0,-0,12,-3.25,1e10,2E-3,4.5e+6]}]]]],"e":{},"f":[]}"#,
        // White space between every token, and non-ASCII bytes in strings.
        "\r\n {\t\"id\" : null ,\n \"result\" : [ \"caf\u{e9}\" , { } ] }",
    ];

    #[test]
    fn jsonrpc_edge_cases_at_every_split() {
        let stream = JSON_MESSAGES.concat();
        let lens: Vec<usize> = JSON_MESSAGES.iter().map(|m| m.len()).collect();
        assert_frames_at_every_split(Framing::JsonRpc, 1 << 20, stream.as_bytes(), &lens);
    }

    #[test]
    fn jsonrpc_trailing_space_is_not_a_partial_message() {
        let framer = Framer::new(Framing::JsonRpc, 100);
        assert!(!framer.is_partial(b" \n\t\r"));
        assert!(framer.is_partial(b" {"));
    }

    #[test]
    fn jsonrpc_garbage_is_rejected_with_where_and_what() {
        let cases: &[(&str, usize, &str)] = &[
            ("[1,2]", 0, "'{' to start"),
            ("hello", 0, "'{' to start"),
            (r#"{"a" 1}"#, 5, "':'"),
            (r#"{"a":}"#, 5, "a JSON value"),
            (r#"{"a":1,}"#, 7, "a member name"),
            (r#"{"a":[1,]}"#, 8, "a JSON value"),
            (r#"{"a":tru}"#, 8, "the rest of"),
            (r#"{"a":01}"#, 6, "',' or '}'"),
            (r#"{"a":-}"#, 6, "a digit"),
            (r#"{"a":1.}"#, 7, "a digit"),
            (r#"{"a":"\x"}"#, 7, "an escape character"),
            (r#"{"a":"\u12G4"}"#, 10, "a hexadecimal digit"),
            (
                "{\"a\":\"line\nbreak\"}",
                10,
                "an escaped control character",
            ),
            (r#"{"a":[1}"#, 7, "',' or ']'"),
            (r#"{"a":1]"#, 6, "',' or '}'"),
            (r#"{1:2}"#, 1, "a member name or '}'"),
        ];
        for (input, offset, expected) in cases {
            let mut framer = Framer::new(Framing::JsonRpc, 1 << 20);
            match framer.next_message(input.as_bytes()) {
                Err(FrameError::Json {
                    offset: o,
                    expected: e,
                    ..
                }) => {
                    assert_eq!((o, e.contains(expected)), (*offset, true), "{input}: {e}");
                }
                other => panic!("{input}: expected a JSON error, got {other:?}"),
            }
        }
    }

    #[test]
    fn jsonrpc_size_limit_counts_the_message_not_the_space_before_it() {
        let mut framer = Framer::new(Framing::JsonRpc, 10);
        assert_eq!(framer.next_message(b"      {\"a\":1}").unwrap(), Some(13));
        let mut framer = Framer::new(Framing::JsonRpc, 10);
        let err = framer.next_message(br#"{"a":"0123456789"}"#).unwrap_err();
        assert_eq!(
            err,
            FrameError::TooLarge {
                length: 11,
                limit: 10
            }
        );
    }

    #[test]
    fn jsonrpc_limit_holds_to_the_last_byte() {
        let msg = br#"{"a":12345}"#; // 11 bytes
        let mut framer = Framer::new(Framing::JsonRpc, 11);
        assert_eq!(framer.next_message(msg).unwrap(), Some(11));
        let mut framer = Framer::new(Framing::JsonRpc, 10);
        assert_eq!(
            framer.next_message(msg).unwrap_err(),
            FrameError::TooLarge {
                length: 11,
                limit: 10
            }
        );
    }

    #[test]
    fn jsonrpc_very_deep_nesting_needs_no_recursion() {
        let depth = 100_000;
        let msg = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        let mut framer = Framer::new(Framing::JsonRpc, 1 << 20);
        assert_eq!(
            framer.next_message(msg.as_bytes()).unwrap(),
            Some(msg.len())
        );
    }

    #[test]
    fn raw_passes_whatever_arrives() {
        let mut framer = Framer::new(Framing::Raw, 0);
        assert_eq!(framer.next_message(b"").unwrap(), None);
        assert_eq!(framer.next_message(b"abc").unwrap(), Some(3));
        assert!(framer.is_partial(b"x"));
    }
}
