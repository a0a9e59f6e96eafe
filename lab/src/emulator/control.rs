//! The forwarder's control protocol, its client, and the counter reports.
//!
//! Protocol: one request per Unix stream connection. The client writes one JSON object and
//! a newline; the forwarder answers one JSON object and a newline, then closes. Requests:
//!
//! ```json
//! {"cmd":"show"}
//! {"cmd":"set","a_to_b":{"delay_ns":25000000},"b_to_a":{"loss":{"model":"bernoulli","p":0.01}}}
//! {"cmd":"nat","settings":{"inside":"b","first_port":40001}}
//! {"cmd":"nat","settings":null}
//! {"cmd":"reset_counters"}
//! {"cmd":"shutdown"}
//! ```
//!
//! `set` takes a [`DirPatch`] per direction: only the fields present change. `nat`
//! installs a fresh NAT at one end ([`super::nat`]; a NAT already there is replaced, so
//! its mappings are gone: a rebind) or, with `null`, removes it. Every answer
//! is `{"ok":true,"state":{…}}` ([`LinkState`], raw counters) or `{"ok":false,"error":"…"}`.
//! [`LinkState::report`] turns raw counters into a [`LinkReport`] under a stated wire
//! accounting convention ([`Accounting`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::classify::Class;
use super::model::{ClassCounters, DirCounters, DirSettings, JitterDist, LossModel, Tally};
use super::nat::{NatSettings, NatState};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // rare control messages; boxing would only obscure them
pub enum Request {
    Show,
    Set {
        #[serde(default)]
        a_to_b: Option<DirPatch>,
        #[serde(default)]
        b_to_a: Option<DirPatch>,
    },
    Nat {
        settings: Option<NatSettings>,
    },
    ResetCounters,
    Shutdown,
}

/// A partial [`DirSettings`]: `None` fields are left unchanged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter_dist: Option<JitterDist>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reorder: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<LossModel>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_frames: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
}

impl DirPatch {
    pub fn is_empty(&self) -> bool {
        *self == DirPatch::default()
    }

    pub fn apply(&self, s: &DirSettings) -> DirSettings {
        let mut s = s.clone();
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { s.$f = v; } )* };
        }
        set!(
            delay_ns,
            jitter_ns,
            jitter_dist,
            reorder,
            loss,
            rate_bps,
            queue_frames,
            queue_bytes,
            up
        );
        s
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<LinkState>,
}

/// Raw state of a running forwarder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkState {
    pub name: String,
    pub pid: u32,
    pub ns_a: String,
    pub ns_b: String,
    pub tap_a: String,
    pub tap_b: String,
    /// Physical overhead per frame used for rate serialization (and default for reports).
    pub phy_overhead: u32,
    pub quic_port: u16,
    pub seed: u64,
    /// Since the forwarder started (or counters were last reset).
    pub counting_ns: u64,
    pub a_to_b: DirState,
    pub b_to_a: DirState,
    /// The NAT at one end, if one is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<NatState>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DirState {
    pub settings: DirSettings,
    pub in_flight: u64,
    pub counters: DirCounters,
}

/// How frame bytes become wire bytes in a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accounting {
    /// Bytes added per frame for preamble, FCS, inter-frame gap (24 = 8 + 4 + 12; the
    /// quicSDN paper's Table 1 uses 28).
    pub phy_overhead: u32,
    /// Count Ethernet minimum-size padding (frames shorter than 60 bytes).
    pub pad_to_min_frame: bool,
}

impl Default for Accounting {
    fn default() -> Self {
        Self {
            phy_overhead: 24,
            pad_to_min_frame: false,
        }
    }
}

impl Accounting {
    pub fn convention(&self) -> String {
        format!(
            "bytes = Ethernet frame incl. 14-byte header, excl. FCS (as tcpdump and interface \
             counters); wire_bytes = bytes{} + {} bytes/frame physical overhead{}; \
             payload_bytes = TCP/UDP payload",
            if self.pad_to_min_frame {
                " + padding to the 60-byte minimum frame"
            } else {
                ""
            },
            self.phy_overhead,
            if self.phy_overhead == 24 {
                " (preamble 8 + FCS 4 + inter-frame gap 12)"
            } else if self.phy_overhead == 28 {
                " (the quicSDN paper's Table 1 convention)"
            } else {
                ""
            }
        )
    }

    pub fn tally(&self, t: &Tally) -> TallyReport {
        let pad = if self.pad_to_min_frame {
            t.pad_bytes
        } else {
            0
        };
        TallyReport {
            frames: t.frames,
            bytes: t.bytes,
            wire_bytes: t.bytes + pad + t.frames * self.phy_overhead as u64,
            payload_bytes: t.payload_bytes,
            ack_only_frames: t.ack_only_frames,
            ack_only_wire_bytes: t.ack_only_bytes + t.ack_only_frames * self.phy_overhead as u64,
            handshake_frames: t.handshake_frames,
            handshake_wire_bytes: t.handshake_bytes + t.handshake_frames * self.phy_overhead as u64,
        }
    }

    pub fn counters(&self, c: &ClassCounters) -> CountersReport {
        CountersReport {
            offered: self.tally(&c.offered),
            lost: self.tally(&c.lost),
            queue_dropped: self.tally(&c.queue_dropped),
            down_dropped: self.tally(&c.down_dropped),
            delivered: self.tally(&c.delivered),
            tx_errors: self.tally(&c.tx_errors),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TallyReport {
    pub frames: u64,
    pub bytes: u64,
    pub wire_bytes: u64,
    pub payload_bytes: u64,
    /// Frames carrying only transport control (TCP: no payload, ACK without
    /// SYN/FIN/RST; UDP: a datagram too small to carry application data; see
    /// `Classifier::is_ack_only`).
    #[serde(default)]
    pub ack_only_frames: u64,
    /// Their wire bytes (without Ethernet padding).
    #[serde(default)]
    pub ack_only_wire_bytes: u64,
    /// Connection setup and teardown frames (TCP SYN/FIN/RST, QUIC long
    /// headers; `FrameKind::Handshake`) and their wire bytes (without padding).
    #[serde(default)]
    pub handshake_frames: u64,
    #[serde(default)]
    pub handshake_wire_bytes: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersReport {
    pub offered: TallyReport,
    pub lost: TallyReport,
    pub queue_dropped: TallyReport,
    pub down_dropped: TallyReport,
    pub delivered: TallyReport,
    pub tx_errors: TallyReport,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccountingReport {
    pub ethernet_header_bytes: u32,
    pub phy_overhead_per_frame: u32,
    pub pad_to_min_frame: bool,
    pub convention: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DirReport {
    pub from_ns: String,
    pub to_ns: String,
    pub summary: String,
    pub settings: DirSettings,
    pub in_flight: u64,
    pub total: CountersReport,
    /// Keyed by class name: openflow, ovsdb, tcp_other, quic, udp_other, icmp, arp, other.
    pub classes: BTreeMap<String, CountersReport>,
}

/// What `quicsdn-lab link show` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkReport {
    pub link: String,
    pub pid: u32,
    pub tap_a: String,
    pub tap_b: String,
    pub quic_port: u16,
    pub counting_seconds: f64,
    pub accounting: AccountingReport,
    pub a_to_b: DirReport,
    pub b_to_a: DirReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<NatState>,
}

impl LinkState {
    pub fn dir(&self, a_to_b: bool) -> &DirState {
        if a_to_b { &self.a_to_b } else { &self.b_to_a }
    }

    pub fn report(&self, acc: &Accounting) -> LinkReport {
        let dir = |d: &DirState, from: &str, to: &str| DirReport {
            from_ns: from.to_string(),
            to_ns: to.to_string(),
            summary: d.settings.summary(),
            settings: d.settings.clone(),
            in_flight: d.in_flight,
            total: acc.counters(&d.counters.total()),
            classes: Class::ALL
                .iter()
                .map(|&c| (c.name().to_string(), acc.counters(d.counters.class(c))))
                .collect(),
        };
        LinkReport {
            link: self.name.clone(),
            pid: self.pid,
            tap_a: self.tap_a.clone(),
            tap_b: self.tap_b.clone(),
            quic_port: self.quic_port,
            counting_seconds: self.counting_ns as f64 / 1e9,
            accounting: AccountingReport {
                ethernet_header_bytes: 14,
                phy_overhead_per_frame: acc.phy_overhead,
                pad_to_min_frame: acc.pad_to_min_frame,
                convention: acc.convention(),
            },
            a_to_b: dir(&self.a_to_b, &self.ns_a, &self.ns_b),
            b_to_a: dir(&self.b_to_a, &self.ns_b, &self.ns_a),
            nat: self.nat.clone(),
        }
    }
}

/// Client for one forwarder's control socket. Each call is one short connection, so a
/// `LinkControl` is cheap and holds no resources.
#[derive(Clone, Debug)]
pub struct LinkControl {
    pub name: String,
    pub path: PathBuf,
}

impl LinkControl {
    pub fn new(name: impl Into<String>, path: impl AsRef<Path>) -> Self {
        Self {
            name: name.into(),
            path: path.as_ref().to_path_buf(),
        }
    }

    pub fn request(&self, req: &Request) -> Result<LinkState> {
        let ctx = || format!("link {}: control socket {}", self.name, self.path.display());
        let mut s = UnixStream::connect(&self.path)
            .with_context(|| format!("{}: cannot connect (is the forwarder running?)", ctx()))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.set_write_timeout(Some(Duration::from_secs(5)))?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        s.write_all(&line).with_context(ctx)?;
        let mut answer = String::new();
        BufReader::new(&s)
            .read_line(&mut answer)
            .with_context(|| format!("{}: no answer", ctx()))?;
        let resp: Response = serde_json::from_str(&answer)
            .with_context(|| format!("{}: bad answer {answer:?}", ctx()))?;
        if !resp.ok {
            bail!(
                "link {}: forwarder refused: {}",
                self.name,
                resp.error.unwrap_or_default()
            );
        }
        resp.state
            .with_context(|| format!("{}: answer without state", ctx()))
    }

    pub fn show(&self) -> Result<LinkState> {
        self.request(&Request::Show)
    }

    /// Changes settings at runtime; connections crossing the link are not disturbed.
    pub fn set(&self, a_to_b: Option<DirPatch>, b_to_a: Option<DirPatch>) -> Result<LinkState> {
        self.request(&Request::Set { a_to_b, b_to_a })
    }

    /// Same patch for both directions.
    pub fn set_both(&self, patch: DirPatch) -> Result<LinkState> {
        self.set(Some(patch.clone()), Some(patch))
    }

    /// Installs a fresh NAT (replacing, and so rebinding, one already there) or,
    /// with `None`, removes it.
    pub fn nat(&self, settings: Option<NatSettings>) -> Result<LinkState> {
        self.request(&Request::Nat { settings })
    }

    pub fn reset_counters(&self) -> Result<LinkState> {
        self.request(&Request::ResetCounters)
    }

    /// Asks the forwarder to exit; its TAP devices stay (they are persistent).
    pub fn shutdown(&self) -> Result<LinkState> {
        self.request(&Request::Shutdown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_shapes() {
        let r: Request = serde_json::from_str(
            r#"{"cmd":"set","a_to_b":{"delay_ns":25000000,"loss":{"model":"bernoulli","p":0.01}}}"#,
        )
        .unwrap();
        let Request::Set { a_to_b, b_to_a } = r else {
            panic!()
        };
        assert!(b_to_a.is_none());
        let s = a_to_b.unwrap().apply(&DirSettings::default());
        assert_eq!(s.delay_ns, 25_000_000);
        assert_eq!(s.loss, LossModel::Bernoulli { p: 0.01 });
        assert_eq!(s.queue_frames, 1000, "untouched fields keep their value");
        assert!(
            serde_json::from_str::<Request>(r#"{"cmd":"set","a_to_b":{"dealy_ns":1}}"#).is_err()
        );
        assert_eq!(
            serde_json::to_string(&Request::Show).unwrap(),
            r#"{"cmd":"show"}"#
        );
    }

    #[test]
    fn accounting_conventions() {
        let t = Tally {
            frames: 10,
            bytes: 1000,
            payload_bytes: 400,
            pad_bytes: 60,
            ack_only_frames: 3,
            ack_only_bytes: 150,
            handshake_frames: 1,
            handshake_bytes: 80,
        };
        let a = Accounting::default();
        assert_eq!(a.tally(&t).wire_bytes, 1240);
        assert_eq!(a.tally(&t).ack_only_wire_bytes, 150 + 3 * 24);
        assert_eq!(a.tally(&t).handshake_wire_bytes, 80 + 24);
        let paper = Accounting {
            phy_overhead: 28,
            pad_to_min_frame: true,
        };
        assert_eq!(paper.tally(&t).wire_bytes, 1000 + 60 + 280);
        assert!(a.convention().contains("24 bytes/frame"));
        assert!(paper.convention().contains("Table 1"));
    }
}
