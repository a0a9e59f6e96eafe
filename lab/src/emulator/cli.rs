//! Command line of the emulator: `quicsdn-lab emulate …`, `quicsdn-lab link …`,
//! `quicsdn-lab bench emulator`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};

use super::control::{Accounting, DirPatch, LinkControl};
use super::link::{self, DEFAULT_RUN_DIR, LinkRecord, LinkSpec};
use super::model::{DirSettings, JitterDist, LossModel};
use super::nat::{NatSettings, Side};
use super::units::{parse_duration_ns, parse_percent, parse_rate_bps};

const UNITS_HELP: &str = "\
Units: durations 25ms, 500us, 1.5s (a unit is required; 0 alone is fine). \
Percentages need a % sign: 1%, 0.5%. \
Rates are decimal, tc-style: bit, kbit, mbit, gbit (bits/s) or bps, kbps, mbps, gbps \
(BYTES/s); 0, off or unlimited = no limit. The rate is Ethernet line rate: each frame \
costs its bytes plus the physical overhead (default 24 bytes: preamble 8, FCS 4, gap 12).";

/// Impairment options shared by `emulate up`, `emulate restart` and `link set`.
#[derive(Args, Debug, Clone, Default)]
pub struct ImpairArgs {
    /// One-way delay, e.g. 25ms.
    #[arg(long, value_parser = parse_duration_ns, value_name = "DURATION")]
    pub delay: Option<u64>,
    /// Jitter amplitude, e.g. 5ms: uniform ±jitter, or σ for --jitter-dist normal.
    #[arg(long, value_parser = parse_duration_ns, value_name = "DURATION")]
    pub jitter: Option<u64>,
    /// Jitter distribution.
    #[arg(long, value_enum, value_name = "DIST")]
    pub jitter_dist: Option<JitterDistArg>,
    /// Let jitter reorder frames (default: no reordering; release times stay monotonic).
    #[arg(long, overrides_with = "no_reorder")]
    pub reorder: bool,
    /// Keep frame order under jitter.
    #[arg(long)]
    pub no_reorder: bool,
    /// Loss: `1%` (Bernoulli), `ge:p=1%,r=25%[,good=0%][,bad=100%]` (Gilbert–Elliott:
    /// p = P(good→bad), r = P(bad→good), loss probability in each state), or `0`.
    #[arg(long, value_parser = parse_loss, value_name = "LOSS")]
    pub loss: Option<LossModel>,
    /// Rate limit (Ethernet line rate), e.g. 100mbit; `off` for none.
    #[arg(long, value_parser = parse_rate_bps, value_name = "RATE")]
    pub rate: Option<u64>,
    /// Rate-limiter queue limit in frames (drop-tail; default 1000).
    #[arg(long, value_name = "FRAMES")]
    pub queue: Option<u32>,
    /// Rate-limiter queue limit in frame bytes (0 = frames limit only).
    #[arg(long, value_name = "BYTES")]
    pub queue_bytes: Option<u64>,
    /// Take the link down (every frame dropped, frames in flight too).
    #[arg(long, conflicts_with = "up")]
    pub down: bool,
    /// Bring the link back up.
    #[arg(long)]
    pub up: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum JitterDistArg {
    Uniform,
    Normal,
}

impl ImpairArgs {
    pub fn patch(&self) -> DirPatch {
        DirPatch {
            delay_ns: self.delay,
            jitter_ns: self.jitter,
            jitter_dist: self.jitter_dist.map(|d| match d {
                JitterDistArg::Uniform => JitterDist::Uniform,
                JitterDistArg::Normal => JitterDist::Normal,
            }),
            reorder: if self.reorder {
                Some(true)
            } else if self.no_reorder {
                Some(false)
            } else {
                None
            },
            loss: self.loss,
            rate_bps: self.rate,
            queue_frames: self.queue,
            queue_bytes: self.queue_bytes,
            up: if self.down {
                Some(false)
            } else if self.up {
                Some(true)
            } else {
                None
            },
        }
    }
}

/// Parses `1%`, `0`, or `ge:p=1%,r=25%,good=0%,bad=100%`.
pub fn parse_loss(s: &str) -> Result<LossModel, String> {
    let s = s.trim();
    if s == "0" || s == "off" || s == "none" {
        return Ok(LossModel::None);
    }
    if let Some(params) = s.strip_prefix("ge:").or_else(|| s.strip_prefix("gemodel:")) {
        let (mut p, mut r, mut good, mut bad) = (None, None, 0.0, 1.0);
        for kv in params.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{kv:?}: expected key=value, e.g. p=1%"))?;
            let v = parse_percent(v).map_err(|e| e.to_string())?;
            match k.trim() {
                "p" => p = Some(v),
                "r" => r = Some(v),
                "good" => good = v,
                "bad" => bad = v,
                other => {
                    return Err(format!(
                        "unknown Gilbert–Elliott parameter {other:?} (p, r, good, bad)"
                    ));
                }
            }
        }
        let m = LossModel::GilbertElliott {
            p: p.ok_or("Gilbert–Elliott needs p=…%")?,
            r: r.ok_or("Gilbert–Elliott needs r=…%")?,
            loss_good: good,
            loss_bad: bad,
        };
        m.validate()?;
        return Ok(m);
    }
    let p = parse_percent(s).map_err(|e| format!("{e} (or ge:p=…%,r=…% for bursty loss)"))?;
    Ok(LossModel::random(p))
}

fn default_run_dir() -> PathBuf {
    std::env::var_os("QUICSDN_LAB_EMULATOR_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR))
}

#[derive(Args, Debug)]
pub struct RunDirArg {
    /// Directory of control sockets, records and logs [env: QUICSDN_LAB_EMULATOR_DIR]
    /// [default: /run/quicsdn-lab/emulator].
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
}

impl RunDirArg {
    pub fn get(&self) -> PathBuf {
        self.run_dir.clone().unwrap_or_else(default_run_dir)
    }
}

#[derive(Args, Debug)]
#[command(after_help = UNITS_HELP)]
pub struct EmulateArgs {
    #[command(subcommand)]
    pub cmd: EmulateCmd,
}

#[derive(Subcommand, Debug)]
pub enum EmulateCmd {
    /// Create a link between two existing namespaces and start its forwarder.
    #[command(after_help = UNITS_HELP)]
    Up(UpArgs),
    /// Stop a link's forwarder (by recorded PID) and delete its TAPs.
    Down {
        /// Link name.
        name: String,
        #[command(flatten)]
        run_dir: RunDirArg,
    },
    /// Restart a link's forwarder with changed settings; TAPs and connections stay
    /// (frames in flight and counters are lost; `link set` loses nothing).
    #[command(after_help = UNITS_HELP)]
    Restart {
        /// Link name.
        name: String,
        #[command(flatten)]
        impair: ImpairArgs,
        /// Fix the RNG seed.
        #[arg(long)]
        seed: Option<u64>,
        #[command(flatten)]
        run_dir: RunDirArg,
    },
    /// (internal) The forwarder process itself; started by `up`/`restart`.
    #[command(hide = true)]
    Run {
        #[arg(long)]
        spec: PathBuf,
    },
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Link name (with default TAP names at most 14 characters).
    #[arg(long)]
    pub name: String,
    /// Namespace of side A (e.g. a switch namespace).
    #[arg(long)]
    pub ns_a: String,
    /// Namespace of side B (e.g. the controller namespace).
    #[arg(long)]
    pub ns_b: String,
    /// IPv4 address of side A.
    #[arg(long)]
    pub addr_a: Ipv4Addr,
    /// IPv4 address of side B.
    #[arg(long)]
    pub addr_b: Ipv4Addr,
    /// Prefix length of both addresses.
    #[arg(long, default_value_t = 30)]
    pub prefix_len: u8,
    /// TAP name in namespace A [default: <name>a].
    #[arg(long)]
    pub tap_a: Option<String>,
    /// TAP name in namespace B [default: <name>b].
    #[arg(long)]
    pub tap_b: Option<String>,
    #[command(flatten)]
    pub impair: ImpairArgs,
    /// Physical overhead per frame in bytes, for rate serialization and reports.
    #[arg(long, default_value_t = 24)]
    pub overhead: u32,
    /// UDP port counted as QUIC.
    #[arg(long, default_value_t = 6653)]
    pub quic_port: u16,
    /// Fix the RNG seed (reproducible loss/jitter for identical traffic).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Don't use SCHED_FIFO for the forwarder.
    #[arg(long)]
    pub no_realtime: bool,
    /// Path of the quicsdn-lab binary that runs the forwarder [default: this one].
    #[arg(long, hide = true)]
    pub exe: Option<PathBuf>,
    #[command(flatten)]
    pub run_dir: RunDirArg,
}

#[derive(Args, Debug)]
#[command(after_help = UNITS_HELP)]
pub struct LinkArgs {
    #[command(subcommand)]
    pub cmd: LinkCmd,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DirArg {
    /// Both directions.
    Both,
    /// From namespace A to namespace B.
    A2b,
    /// From namespace B to namespace A.
    B2a,
}

#[derive(Subcommand, Debug)]
pub enum LinkCmd {
    /// Change settings of a running link (only the options given change).
    #[command(after_help = UNITS_HELP)]
    Set {
        /// Link name.
        name: String,
        /// Which direction to change.
        #[arg(long, value_enum, default_value_t = DirArg::Both)]
        dir: DirArg,
        #[command(flatten)]
        impair: ImpairArgs,
        #[command(flatten)]
        run_dir: RunDirArg,
    },
    /// Print settings and counters as JSON (stating the wire-accounting convention).
    Show {
        /// Link name.
        name: String,
        /// Physical overhead per frame for wire_bytes [default: the link's, normally 24;
        /// the quicSDN paper's Table 1 uses 28].
        #[arg(long)]
        overhead: Option<u32>,
        /// Count Ethernet padding of frames shorter than 60 bytes in wire_bytes.
        #[arg(long)]
        pad: bool,
        /// Only totals per direction (no per-class breakdown).
        #[arg(long)]
        totals: bool,
        #[command(flatten)]
        run_dir: RunDirArg,
    },
    /// Put a NAT at one end of the link, or rebind the one there: UDP and TCP
    /// from that end get new source ports from --port up, and what arrives for
    /// a port with no mapping is dropped (as a NAT drops unsolicited traffic).
    /// Only IPv4 UDP and TCP are translated. Running it again forgets every
    /// mapping: a rebind.
    Nat {
        /// Link name.
        name: String,
        /// The end the NAT sits at (a: namespace A's side, b: namespace B's).
        #[arg(long, value_enum, required_unless_present = "off")]
        inside: Option<Side>,
        /// First outside port handed out.
        #[arg(long, default_value_t = 40001, conflicts_with = "off")]
        port: u16,
        /// Remove the NAT (translation stops; mappings are forgotten).
        #[arg(long)]
        off: bool,
        #[command(flatten)]
        run_dir: RunDirArg,
    },
    /// Zero the counters.
    Reset {
        /// Link name.
        name: String,
        #[command(flatten)]
        run_dir: RunDirArg,
    },
}

pub fn emulate(args: EmulateArgs) -> Result<()> {
    match args.cmd {
        EmulateCmd::Up(a) => {
            let mut spec = LinkSpec::new(&a.name, &a.ns_a, &a.ns_b, a.addr_a, a.addr_b);
            spec.prefix_len = a.prefix_len;
            if let Some(t) = a.tap_a {
                spec.tap_a = t;
            }
            if let Some(t) = a.tap_b {
                spec.tap_b = t;
            }
            let s = a.impair.patch().apply(&DirSettings::default());
            spec = spec.with_settings(s);
            spec.phy_overhead = a.overhead;
            spec.quic_port = a.quic_port;
            spec.seed = a.seed;
            spec.realtime = !a.no_realtime;
            spec.run_dir = a.run_dir.get();
            let exe = match a.exe {
                Some(e) => e,
                None => link::default_exe()?,
            };
            let rec = link::create_link(&spec, &exe)?;
            println!("{}", serde_json::to_string_pretty(&rec)?);
            eprintln!(
                "link {} up: {} {} ({}) <-> {} {} ({}); {}",
                spec.name,
                spec.ns_a,
                spec.tap_a,
                spec.addr_a,
                spec.ns_b,
                spec.tap_b,
                spec.addr_b,
                spec.a_to_b.summary()
            );
            Ok(())
        }
        EmulateCmd::Down { name, run_dir } => {
            let dir = run_dir.get();
            if !link::record_path(&dir, &name).exists() {
                bail!(
                    "link {name}: no record in {} (nothing to tear down)",
                    dir.display()
                );
            }
            link::destroy_link_by_name(&dir, &name)?;
            eprintln!("link {name} down");
            Ok(())
        }
        EmulateCmd::Restart {
            name,
            impair,
            seed,
            run_dir,
        } => {
            let dir = run_dir.get();
            let rec = LinkRecord::load(&dir, &name)?;
            let spec_path = dir.join(format!("{name}.spec.json"));
            let mut spec: LinkSpec = read_json(&spec_path)
                .with_context(|| format!("link {name}: reading {}", spec_path.display()))?;
            let patch = impair.patch();
            spec.a_to_b = patch.apply(&spec.a_to_b);
            spec.b_to_a = patch.apply(&spec.b_to_a);
            if seed.is_some() {
                spec.seed = seed;
            }
            let rec = link::restart_forwarder(&rec, &spec, &link::default_exe()?)?;
            println!("{}", serde_json::to_string_pretty(&rec)?);
            Ok(())
        }
        EmulateCmd::Run { spec } => {
            let spec: LinkSpec = read_json(&spec)
                .with_context(|| format!("forwarder: reading spec {}", spec.display()))?;
            super::forwarder::run(spec)
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T> {
    let s = std::fs::read_to_string(p)?;
    Ok(serde_json::from_str(&s)?)
}

fn control_for(dir: &Path, name: &str) -> LinkControl {
    LinkControl::new(name, link::ctl_path(dir, name))
}

pub fn link(args: LinkArgs) -> Result<()> {
    match args.cmd {
        LinkCmd::Set {
            name,
            dir,
            impair,
            run_dir,
        } => {
            let patch = impair.patch();
            if patch.is_empty() {
                bail!("link set {name}: nothing to change (see --help for the options)");
            }
            let (ab, ba) = match dir {
                DirArg::Both => (Some(patch.clone()), Some(patch)),
                DirArg::A2b => (Some(patch), None),
                DirArg::B2a => (None, Some(patch)),
            };
            let st = control_for(&run_dir.get(), &name).set(ab, ba)?;
            println!(
                "a_to_b ({} -> {}): {}",
                st.ns_a,
                st.ns_b,
                st.a_to_b.settings.summary()
            );
            println!(
                "b_to_a ({} -> {}): {}",
                st.ns_b,
                st.ns_a,
                st.b_to_a.settings.summary()
            );
            Ok(())
        }
        LinkCmd::Show {
            name,
            overhead,
            pad,
            totals,
            run_dir,
        } => {
            let st = control_for(&run_dir.get(), &name).show()?;
            let acc = Accounting {
                phy_overhead: overhead.unwrap_or(st.phy_overhead),
                pad_to_min_frame: pad,
            };
            let mut rep = st.report(&acc);
            if totals {
                rep.a_to_b.classes.clear();
                rep.b_to_a.classes.clear();
            }
            let mut v = serde_json::to_value(&rep)?;
            // Frames the kernel dropped before the emulator read them are not in the
            // emulator's counters; show them next to it (since the TAP was created).
            for (dir, ns, tap) in [
                ("a_to_b", &st.ns_a, &st.tap_a),
                ("b_to_a", &st.ns_b, &st.tap_b),
            ] {
                v[dir]["kernel_sending_tap"] = match link::tap_kernel_stats(&name, ns, tap) {
                    Ok(k) => serde_json::to_value(k)?,
                    Err(e) => serde_json::Value::String(format!("{e:#}")),
                };
            }
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        LinkCmd::Nat {
            name,
            inside,
            port,
            off,
            run_dir,
        } => {
            let settings = inside.filter(|_| !off).map(|inside| NatSettings {
                inside,
                first_port: port,
            });
            let st = control_for(&run_dir.get(), &name).nat(settings)?;
            match st.nat {
                Some(n) => {
                    let ns = match n.settings.inside {
                        Side::A => &st.ns_a,
                        Side::B => &st.ns_b,
                    };
                    eprintln!(
                        "link {name}: NAT in front of {ns}: no mappings; UDP and TCP from {ns} get ports from {} up",
                        n.settings.first_port
                    )
                }
                None => eprintln!("link {name}: no NAT"),
            }
            Ok(())
        }
        LinkCmd::Reset { name, run_dir } => {
            control_for(&run_dir.get(), &name).reset_counters()?;
            eprintln!("link {name}: counters reset");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_syntax() {
        assert_eq!(parse_loss("1%"), Ok(LossModel::Bernoulli { p: 0.01 }));
        assert_eq!(parse_loss("0"), Ok(LossModel::None));
        assert_eq!(
            parse_loss("ge:p=1%,r=25%"),
            Ok(LossModel::GilbertElliott {
                p: 0.01,
                r: 0.25,
                loss_good: 0.0,
                loss_bad: 1.0
            })
        );
        assert_eq!(
            parse_loss("ge:p=2%,r=50%,good=0.1%,bad=80%"),
            Ok(LossModel::GilbertElliott {
                p: 0.02,
                r: 0.5,
                loss_good: 0.001,
                loss_bad: 0.8
            })
        );
        assert!(parse_loss("ge:p=1%").is_err());
        assert!(parse_loss("ge:q=1%,r=2%").is_err());
        assert!(parse_loss("1").is_err());
    }
}
