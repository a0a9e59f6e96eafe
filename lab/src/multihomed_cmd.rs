//! `quicsdn-lab multihomed up|down`: the bicast paper's topology (Figs. 6–7,
//! [`crate::multihomed`]) as a standalone lab that stays up between
//! commands, with a real HTTP server serving a file and, for the QUIC
//! variants, the proxy pair, so a user can run `curl` in the client's
//! namespace, change the paths with `quicsdn-lab link set`, and take it down.
//!
//! The topology, servers and URL are the ones `bench bicast` uses
//! ([`crate::bench::bicast`]); this module only keeps them running after the
//! command returns and records what `down` removes. `down` removes by the
//! names `up` gave (the prefix's namespaces, with every process in them, and
//! links), so it also cleans up after a crashed `up`; it is idempotent.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::bench::bicast::{self, Variant};
use crate::emulator::DirSettings;
use crate::multihomed::{Mode, Multihomed, MultihomedSpec, remove_leftovers};
use crate::netns::Netns;

#[derive(clap::Args, Debug)]
pub struct MultihomedArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Build the multihomed lab and leave it running (replaces one with the
    /// same prefix).
    Up(UpArgs),
    /// Remove the lab with this prefix: its processes, links and namespaces
    /// (idempotent).
    Down {
        #[arg(long, default_value = DEFAULT_PREFIX)]
        prefix: String,
    },
    /// Print what `up` recorded (JSON): the URL, the file's sha256, the
    /// namespaces and the paths' link names.
    Status {
        #[arg(long, default_value = DEFAULT_PREFIX)]
        prefix: String,
    },
}

const DEFAULT_PREFIX: &str = "qmhl";

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Name prefix of the namespaces and links (at most 8 characters).
    #[arg(long, default_value = DEFAULT_PREFIX)]
    pub prefix: String,
    /// unicast: the server's packets on path A; bicast: on both paths (an
    /// OpenFlow group of type ALL installed by os-ken through the agents).
    #[arg(long, value_enum, default_value = "bicast")]
    pub mode: Mode,
    /// TCP straight to the server (tcp-*), or through the QUIC proxy pair
    /// with that congestion controller (quic-*; quic-bbr-lt is the proxy's
    /// default).
    #[arg(long, value_enum, default_value = "quic-bbr-lt")]
    pub variant: Variant,
    /// Rate of each path, each direction.
    #[arg(long, default_value = "100mbit")]
    pub rate: String,
    /// Round-trip time of each path.
    #[arg(long, default_value = "100ms")]
    pub rtt: String,
    /// Loss of each path, each direction (e.g. 10%; `link set` changes it later).
    #[arg(long, default_value = "0%")]
    pub loss: String,
    /// Size of the served file (k, M, G: powers of 1024).
    #[arg(long, default_value = "100M")]
    pub file_size: String,
    /// Controller venvs directory (default: $QUICSDN_VENV_DIR or <repo>/.venv).
    #[arg(long)]
    pub venv_dir: Option<PathBuf>,
}

/// What `up` leaves in `<run dir>/<prefix>-multihomed/state.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Record {
    pub prefix: String,
    pub mode: String,
    pub variant: String,
    /// The namespace to run the client (curl) in, and the URL.
    pub client_netns: String,
    pub url: String,
    pub file_bytes: u64,
    pub file_sha256: String,
    pub namespaces: Vec<String>,
    /// The two paths' emulated links (`quicsdn-lab link set NAME ...`).
    pub links: [String; 2],
    pub dir: PathBuf,
}

fn work_dir(prefix: &str) -> PathBuf {
    PathBuf::from(crate::state::DEFAULT_RUN_DIR).join(format!("{prefix}-multihomed"))
}

pub fn run(args: MultihomedArgs) -> Result<()> {
    match args.action {
        Action::Up(a) => {
            let r = up(&a)?;
            println!(
                "multihomed lab {} is up ({}, {})",
                r.prefix, r.mode, r.variant
            );
            println!(
                "download: ip netns exec {} curl -o /tmp/file.bin {}",
                r.client_netns, r.url
            );
            println!("sha256 {}  ({} bytes)", r.file_sha256, r.file_bytes);
            println!(
                "paths: quicsdn-lab link set {} --loss 10% (path B: {})",
                r.links[0], r.links[1]
            );
            println!(
                "take it down: quicsdn-lab multihomed down --prefix {}",
                r.prefix
            );
        }
        Action::Down { prefix } => {
            if down(&prefix)? {
                println!("multihomed lab {prefix} removed");
            } else {
                println!("no multihomed lab {prefix}; nothing to do");
            }
        }
        Action::Status { prefix } => {
            let path = work_dir(&prefix).join("state.json");
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!("no multihomed lab {prefix} recorded ({})", path.display())
            })?;
            println!("{text}");
        }
    }
    Ok(())
}

/// Builds the lab, starts the HTTP server (and proxies), checks that the
/// client reaches the file, records it and leaves it running.
pub fn up(a: &UpArgs) -> Result<Record> {
    crate::cmd::require_root()?;
    if a.mode == Mode::BicastBoth {
        bail!(
            "--mode bicast-both is the control-channel lab (lab/tests/control_bicast_e2e.rs); use unicast or bicast"
        );
    }
    let path = DirSettings {
        loss: crate::emulator::cli::parse_loss(&a.loss)
            .map_err(|e| anyhow::anyhow!("--loss: {e}"))?,
        ..crate::multihomed::path_settings(&a.rtt, &a.rate)?
    };
    let bytes = crate::bench::proxy::parse_bytes(&a.file_size)?;
    // Whatever a previous lab with this prefix left, first.
    down(&a.prefix)?;
    let work = work_dir(&a.prefix);
    let www = work.join("www");
    std::fs::create_dir_all(&www)?;
    let file = www.join(bicast::FILE);
    bicast::make_file(&file, bytes)?;
    let sha = bicast::sha256(&file)?;
    let mut lab = Multihomed::up(&MultihomedSpec::alike(
        &a.prefix,
        a.mode,
        path,
        work.join("lab"),
        a.venv_dir.clone(),
    ))
    .context("bringing up the multihomed lab")?;
    bicast::start_servers(&mut lab, a.variant, &www)?;
    let url = bicast::file_url(a.variant);
    bicast::wait_http(&lab, &url)?;
    let record = Record {
        prefix: a.prefix.clone(),
        mode: a.mode.as_str().into(),
        variant: a.variant.as_str().into(),
        client_netns: lab.client_ns().name,
        url,
        file_bytes: bytes,
        file_sha256: sha,
        namespaces: crate::multihomed::namespace_names(&a.prefix).to_vec(),
        links: [0, 1].map(|p| crate::multihomed::link_name(&a.prefix, p)),
        dir: work.clone(),
    };
    std::fs::write(
        work.join("state.json"),
        serde_json::to_string_pretty(&record)?,
    )?;
    // Everything runs in its own process group and outlives this command.
    lab.detach();
    Ok(record)
}

/// Removes the lab with `prefix`; false if there was none.
pub fn down(prefix: &str) -> Result<bool> {
    crate::cmd::require_root()?;
    let work = work_dir(prefix);
    let existed = work.exists()
        || crate::multihomed::namespace_names(prefix)
            .iter()
            .any(|n| Netns::exists(n));
    remove_leftovers(prefix)?;
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    Ok(existed)
}
