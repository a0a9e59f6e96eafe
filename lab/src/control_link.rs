//! Control links: one point-to-point link per switch between the controller
//! namespace and the switch's namespace, carrying only control traffic
//! (out-of-band control: it is not part of any OVS bridge).
//!
//! Addressing: link `i` is the /30 `10.254.i.0`, the controller side
//! `10.254.i.1` (interface `sw<i>` in the controller namespace), the switch
//! side `10.254.i.2` (interface `ctl` in the switch namespace).
//!
//! Every control link is an emulated link ([`crate::emulator`]): a TAP device
//! on each side and one forwarder process applying the link's delay, jitter,
//! loss and rate per direction, and counting every frame per protocol class.
//! Its settings can be changed while the lab runs (`quicsdn-lab link set
//! NAME …`, with the name `status` shows) without dropping connections.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::emulator::link::DEFAULT_RUN_DIR;
use crate::emulator::{
    DirSettings, LinkControl, LinkRecord, LinkSpec, LinkState, LossModel, NatSettings, create_link,
    destroy_link, destroy_link_by_name, units,
};
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
    /// The emulator's random seed (`None`: a fresh one). Benches that compare
    /// transports give each the same seed, so their links draw the same losses
    /// for the same packet sequence, and a tail percentile at 1 % loss does
    /// not hang on which run happened to lose more.
    #[serde(default)]
    pub seed: Option<u64>,
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

/// Parses `25ms`, `1.5ms`, `500us`, `2s` (a unit is required).
pub fn parse_duration(s: &str) -> Result<Duration> {
    Ok(Duration::from_nanos(units::parse_duration_ns(s)?))
}

/// Parses `1%`, `0.5%` (the `%` is required; 0–100) into a percentage.
pub fn parse_percent(s: &str) -> Result<f64> {
    Ok(units::parse_percent(s)? * 100.0)
}

/// Parses a rate in tc's units: `100mbit`, `1gbit`, `500kbit`, also
/// `bps`-style bytes (`10mbps` = 80 Mbit/s), decimal multipliers.
pub fn parse_rate(s: &str) -> Result<u64> {
    match units::parse_rate_bps(s)? {
        0 => bail!("{s:?}: a control link needs a positive rate (omit --rate for none)"),
        bps => Ok(bps),
    }
}

/// Which implementation carries a control link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlLinkKind {
    /// The lab's link emulator: TAPs and a forwarder process.
    Emulated,
}

/// Where a control link goes and what it should do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlLinkSpec {
    /// Switch number (1-based); gives the addresses.
    pub index: u32,
    pub ctl_netns: String,
    pub sw_netns: String,
    pub impairment: Impairment,
    /// The lab's prefix: names the emulated link (`PREFIX-cI`).
    #[serde(default)]
    pub prefix: String,
}

impl ControlLinkSpec {
    pub fn new(
        index: u32,
        prefix: &str,
        ctl_netns: &str,
        sw_netns: &str,
        impairment: Impairment,
    ) -> Self {
        ControlLinkSpec {
            index,
            ctl_netns: ctl_netns.into(),
            sw_netns: sw_netns.into(),
            impairment,
            prefix: prefix.into(),
        }
    }

    /// The emulated link's name, for `quicsdn-lab link set|show NAME`.
    pub fn link_name(&self) -> String {
        format!("{}-c{}", self.prefix, self.index)
    }

    /// The emulator settings of each direction (the same both ways): uniform
    /// jitter without reordering, Bernoulli loss, a rate with the emulator's
    /// default queue.
    pub fn dir_settings(&self) -> DirSettings {
        let i = &self.impairment;
        DirSettings {
            delay_ns: i.delay.map_or(0, |d| d.as_nanos() as u64),
            jitter_ns: i.jitter.map_or(0, |d| d.as_nanos() as u64),
            loss: match i.loss_percent {
                Some(p) if p > 0.0 => LossModel::Bernoulli { p: p / 100.0 },
                _ => LossModel::None,
            },
            rate_bps: i.rate_bps.unwrap_or(0),
            ..DirSettings::default()
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
    /// Helper processes, stopped by recorded PID (none: the forwarder is in
    /// `emulator`).
    pub procs: Vec<ProcRecord>,
    /// The emulated link, once created (`None` if `up` stopped before that).
    #[serde(default)]
    pub emulator: Option<LinkRecord>,
}

impl ControlLink {
    /// The emulator's record of a link about to be created, written into the
    /// lab's state first so that `down` finds it even if creation stops half-way.
    pub fn planned(spec: ControlLinkSpec) -> ControlLink {
        ControlLink {
            kind: ControlLinkKind::Emulated,
            spec,
            procs: Vec::new(),
            emulator: None,
        }
    }

    /// Creates the link (TAPs, addresses, forwarder) with the spec's impairment.
    /// `exe` is the `quicsdn-lab` binary (the forwarder runs as its subcommand).
    pub fn create(spec: ControlLinkSpec, exe: &std::path::Path) -> Result<ControlLink> {
        spec.octet()?;
        let mut link = ControlLink::planned(spec);
        let s = &link.spec;
        let mut es = LinkSpec::new(
            &s.link_name(),
            &s.ctl_netns,
            &s.sw_netns,
            s.ctl_addr(),
            s.sw_addr(),
        )
        .with_settings(s.dir_settings());
        es.tap_a = s.ctl_ifname();
        es.tap_b = s.sw_ifname();
        es.seed = s.impairment.seed;
        link.emulator = Some(create_link(&es, exe)?);
        Ok(link)
    }

    fn control(&self) -> Result<LinkControl> {
        match &self.emulator {
            Some(rec) => Ok(rec.control()),
            None => bail!("control link {} was never created", self.spec.link_name()),
        }
    }

    /// The emulator's live state (settings and counters).
    pub fn state(&self) -> Result<LinkState> {
        self.control()?.show()
    }

    /// Installs (or rebinds, or with `None` removes) a NAT on the link. The
    /// link's side A is the controller's end, side B the switch's.
    pub fn set_nat(&self, settings: Option<NatSettings>) -> Result<LinkState> {
        self.control()?.nat(settings)
    }

    /// Stops the forwarder (PID-checked) and removes the TAPs. Idempotent.
    pub fn destroy(&self) -> Result<()> {
        for p in &self.procs {
            p.terminate(Duration::from_secs(5))?;
        }
        match &self.emulator {
            Some(rec) => destroy_link(rec),
            // Created half-way by a crashed `up`: the emulator's own record says what.
            None => destroy_link_by_name(
                std::path::Path::new(DEFAULT_RUN_DIR),
                &self.spec.link_name(),
            ),
        }
    }
}

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
    fn addresses_names_and_settings() {
        let imp = Impairment {
            delay: Some(Duration::from_millis(25)),
            jitter: Some(Duration::from_millis(5)),
            loss_percent: Some(1.0),
            rate_bps: Some(100_000_000),
            seed: None,
        };
        let s = ControlLinkSpec::new(3, "p", "p-ctl", "p-sw3", imp);
        assert_eq!(s.ctl_addr(), Ipv4Addr::new(10, 254, 3, 1));
        assert_eq!(s.sw_addr(), Ipv4Addr::new(10, 254, 3, 2));
        assert_eq!(s.ctl_ifname(), "sw3");
        assert_eq!(s.link_name(), "p-c3");
        let d = s.dir_settings();
        assert_eq!(
            (d.delay_ns, d.jitter_ns, d.rate_bps),
            (25_000_000, 5_000_000, 100_000_000)
        );
        assert_eq!(d.loss, LossModel::Bernoulli { p: 0.01 });
        assert!(!d.reorder);
        let none = ControlLinkSpec::new(1, "p", "a", "b", Impairment::default()).dir_settings();
        assert_eq!(none, DirSettings::default());
        assert!(
            ControlLinkSpec::new(251, "p", "a", "b", Impairment::default())
                .octet()
                .is_err()
        );
    }
}
