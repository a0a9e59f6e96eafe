//! Control links: one point-to-point link per switch between the controller
//! namespace and the switch's namespace, carrying only control traffic
//! (out-of-band control: it is not part of any OVS bridge).
//!
//! Addressing: link `i` is the /30 `10.254.i.0`, the controller side
//! `10.254.i.1` (interface `sw<i>` in the controller namespace), the switch
//! side `10.254.i.2` (interface `ctl` in the switch namespace).
//!
//! Implementations ([`ControlLinkKind`]):
//! * `Veth`: a plain veth pair, no impairment. Asking it for delay, jitter,
//!   loss or rate is an error, never silently ignored.
//! * The TAP-based link emulator (`quicsdn_lab::emulator`, built separately)
//!   plugs in as another kind; its forwarder processes go in
//!   [`ControlLink::procs`], so `down` stops them by recorded PID like any other.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::netns::{IfCounters, Netns, VethEnd, create_veth};
use crate::process::ProcRecord;

/// Delay, jitter, loss and rate of a control link, each per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Impairment {
    pub delay: Option<Duration>,
    pub jitter: Option<Duration>,
    /// Random loss in percent (0–100).
    pub loss_percent: Option<f64>,
    /// Bits per second.
    pub rate_bps: Option<u64>,
}

impl Impairment {
    /// True when nothing is set (a zero value counts as set: the user asked).
    pub fn is_none(&self) -> bool {
        self.delay.is_none()
            && self.jitter.is_none()
            && self.loss_percent.is_none()
            && self.rate_bps.is_none()
    }
}

impl fmt::Display for Impairment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            return f.write_str("no impairment");
        }
        let mut parts = Vec::new();
        if let Some(d) = self.delay {
            parts.push(format!("delay {:?}", d));
        }
        if let Some(j) = self.jitter {
            parts.push(format!("jitter {:?}", j));
        }
        if let Some(l) = self.loss_percent {
            parts.push(format!("loss {l}%"));
        }
        if let Some(r) = self.rate_bps {
            parts.push(format!("rate {r} bit/s"));
        }
        write!(f, "{} (each direction)", parts.join(", "))
    }
}

fn split_number(s: &str) -> Result<(f64, &str)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let v: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("{s:?}: expected a number followed by a unit"))?;
    if !v.is_finite() {
        bail!("{s:?}: not a finite number");
    }
    Ok((v, unit.trim()))
}

/// Parses `25ms`, `1.5ms`, `500us`, `2s` (a unit is required).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let (v, unit) = split_number(s)?;
    let secs = match unit {
        "s" => v,
        "ms" => v / 1e3,
        "us" | "µs" => v / 1e6,
        "ns" => v / 1e9,
        _ => bail!("{s:?}: unknown time unit {unit:?} (use s, ms, us or ns)"),
    };
    if secs > 3600.0 {
        bail!("{s:?}: more than an hour");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `1%`, `0.5%` (the `%` is required; 0–100).
pub fn parse_percent(s: &str) -> Result<f64> {
    let (v, unit) = split_number(s)?;
    if unit != "%" {
        bail!("{s:?}: write loss as a percentage, e.g. 1%");
    }
    if !(0.0..=100.0).contains(&v) {
        bail!("{s:?}: loss must be between 0% and 100%");
    }
    Ok(v)
}

/// Parses a rate in tc's units: `100mbit`, `1gbit`, `500kbit`, `64bit`,
/// also `bps`-style bytes (`10mbps` = 80 Mbit/s), decimal multipliers.
pub fn parse_rate(s: &str) -> Result<u64> {
    let (v, unit) = split_number(s)?;
    let unit = unit.to_ascii_lowercase();
    let (mult, bits) = match unit.as_str() {
        "bit" => (1.0, 1.0),
        "kbit" => (1e3, 1.0),
        "mbit" => (1e6, 1.0),
        "gbit" => (1e9, 1.0),
        "bps" => (1.0, 8.0),
        "kbps" => (1e3, 8.0),
        "mbps" => (1e6, 8.0),
        "gbps" => (1e9, 8.0),
        _ => bail!(
            "{s:?}: unknown rate unit {unit:?} (bit, kbit, mbit, gbit, or bps, kbps, mbps, gbps for bytes)"
        ),
    };
    let bps = v * mult * bits;
    if bps < 1.0 {
        bail!("{s:?}: rate must be at least 1 bit/s");
    }
    Ok(bps as u64)
}

/// Which implementation carries a control link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlLinkKind {
    /// A plain veth pair: no impairment, kernel counters.
    Veth,
}

/// Where a control link goes and what it should do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlLinkSpec {
    /// Switch number (1-based); gives the addresses.
    pub index: u32,
    pub ctl_netns: String,
    pub sw_netns: String,
    pub impairment: Impairment,
}

impl ControlLinkSpec {
    pub fn new(index: u32, ctl_netns: &str, sw_netns: &str, impairment: Impairment) -> Self {
        ControlLinkSpec {
            index,
            ctl_netns: ctl_netns.into(),
            sw_netns: sw_netns.into(),
            impairment,
        }
    }

    /// Interface name in the controller namespace: `sw<i>`.
    pub fn ctl_ifname(&self) -> String {
        format!("sw{}", self.index)
    }

    /// Interface name in the switch namespace: `ctl`.
    pub fn sw_ifname(&self) -> String {
        "ctl".into()
    }

    fn octet(&self) -> Result<u8> {
        match u8::try_from(self.index) {
            Ok(i) if (1..=250).contains(&i) => Ok(i),
            _ => bail!("control link index {} out of range 1..=250", self.index),
        }
    }

    /// The controller side's address, `10.254.i.1`.
    pub fn ctl_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 254, self.index as u8, 1)
    }

    /// The switch side's address, `10.254.i.2`.
    pub fn sw_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 254, self.index as u8, 2)
    }
}

/// A created control link, as recorded in the lab's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlLink {
    pub kind: ControlLinkKind,
    pub spec: ControlLinkSpec,
    /// Helper processes (e.g. emulator forwarders); none for `Veth`.
    pub procs: Vec<ProcRecord>,
}

/// Counters of one control link, per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlLinkCounters {
    /// Frames sent by the controller side (kernel counters of its interface).
    pub ctl_to_sw: DirCounters,
    /// Frames sent by the switch side.
    pub sw_to_ctl: DirCounters,
}

/// One direction: frames and bytes (Ethernet frame with its 14-byte header,
/// no FCS/preamble/gap) as sent and as received at the far end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirCounters {
    pub sent_packets: u64,
    pub sent_bytes: u64,
    pub delivered_packets: u64,
    pub delivered_bytes: u64,
}

fn dir(tx: &IfCounters, rx: &IfCounters) -> DirCounters {
    DirCounters {
        sent_packets: tx.tx_packets,
        sent_bytes: tx.tx_bytes,
        delivered_packets: rx.rx_packets,
        delivered_bytes: rx.rx_bytes,
    }
}

impl ControlLink {
    /// Creates the link and configures both ends' addresses. Errors if `kind`
    /// cannot provide what `spec.impairment` asks for.
    pub fn create(kind: ControlLinkKind, spec: ControlLinkSpec) -> Result<ControlLink> {
        spec.octet()?;
        match kind {
            ControlLinkKind::Veth => {
                if !spec.impairment.is_none() {
                    bail!("{}", EMULATOR_NOT_AVAILABLE);
                }
                let ctl = Netns::named(&spec.ctl_netns);
                let sw = Netns::named(&spec.sw_netns);
                create_veth(
                    &VethEnd::new(&ctl, &spec.ctl_ifname()),
                    &VethEnd::new(&sw, &spec.sw_ifname()),
                )?;
                ctl.add_addr(&spec.ctl_ifname(), &format!("{}/30", spec.ctl_addr()))?;
                sw.add_addr(&spec.sw_ifname(), &format!("{}/30", spec.sw_addr()))?;
                ctl.link_up(&spec.ctl_ifname())?;
                sw.link_up(&spec.sw_ifname())?;
            }
        }
        Ok(ControlLink {
            kind,
            spec,
            procs: Vec::new(),
        })
    }

    /// Per-direction counters.
    pub fn counters(&self) -> Result<ControlLinkCounters> {
        let ctl = Netns::named(&self.spec.ctl_netns).counters(&self.spec.ctl_ifname())?;
        let sw = Netns::named(&self.spec.sw_netns).counters(&self.spec.sw_ifname())?;
        Ok(ControlLinkCounters {
            ctl_to_sw: dir(&ctl, &sw),
            sw_to_ctl: dir(&sw, &ctl),
        })
    }

    /// Stops helper processes by recorded PID and removes the interfaces.
    /// Idempotent (interfaces already gone with their namespace are fine).
    pub fn destroy(&self) -> Result<()> {
        for p in &self.procs {
            p.terminate(Duration::from_secs(5))?;
        }
        let ctl = Netns::named(&self.spec.ctl_netns);
        if Netns::exists(&ctl.name)
            && ctl
                .ip(&["link", "show", "dev", &self.spec.ctl_ifname()])
                .is_ok()
        {
            // Deleting one end of a veth deletes both.
            ctl.ip(&["link", "del", "dev", &self.spec.ctl_ifname()])?;
        }
        Ok(())
    }
}

/// The error for impairment without the emulator.
pub const EMULATOR_NOT_AVAILABLE: &str = "control-link impairment (--delay, --jitter, --loss, --rate) needs the link emulator, \
     which is not available yet in this build: control links are plain veth pairs. \
     Run without those options.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("25ms").unwrap(), Duration::from_millis(25));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        for bad in ["25", "ms", "25 parsecs", "-1ms", "1e3ms", "2h", ""] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("1%").unwrap(), 1.0);
        assert_eq!(parse_percent("0.5%").unwrap(), 0.5);
        for bad in ["1", "101%", "%", "x%"] {
            assert!(parse_percent(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1Gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("500kbit").unwrap(), 500_000);
        assert_eq!(parse_rate("10mbps").unwrap(), 80_000_000);
        for bad in ["100", "100mb", "0bit", "fast"] {
            assert!(parse_rate(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn addresses_and_names() {
        let s = ControlLinkSpec::new(3, "p-ctl", "p-sw3", Impairment::default());
        assert_eq!(s.ctl_addr(), Ipv4Addr::new(10, 254, 3, 1));
        assert_eq!(s.sw_addr(), Ipv4Addr::new(10, 254, 3, 2));
        assert_eq!(s.ctl_ifname(), "sw3");
        assert!(
            ControlLinkSpec::new(251, "a", "b", Impairment::default())
                .octet()
                .is_err()
        );
    }

    #[test]
    fn veth_refuses_impairment() {
        let imp = Impairment {
            delay: Some(Duration::from_millis(25)),
            ..Impairment::default()
        };
        let err = ControlLink::create(
            ControlLinkKind::Veth,
            ControlLinkSpec::new(1, "a", "b", imp),
        )
        .unwrap_err();
        assert!(err.to_string().contains("emulator"), "{err}");
    }
}
