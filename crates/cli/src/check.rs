//! `quicsdn check-config FILE`: everything an agent checks before it starts,
//! without starting it (no socket is bound, nothing is connected).

use crate::args::{CheckConfigArgs, Cli, Command, FileConfig, Role};
use anyhow::{Context, Result, bail};
use clap::Parser;
use quicsdn_agent::AgentTransport;
use quicsdn_agent::config::CommonConfig;
use quicsdn_transport::tls::Credentials;

pub fn run(args: CheckConfigArgs) -> Result<()> {
    let path = args.file.display().to_string();
    let file = FileConfig::load(Some(&args.file))?;
    let role = args.role.unwrap_or(if file.controller.is_some() {
        Role::Switch
    } else {
        Role::Controller
    });
    // The agent's own parsing, as `quicsdn switch|controller --config FILE`.
    let command = match role {
        Role::Switch => "switch",
        Role::Controller => "controller",
    };
    let cli = Cli::try_parse_from(["quicsdn", command, "--config", &path])?;
    let (common, summary) = match cli.command {
        Command::Switch(a) => {
            let c = a.resolve(file).with_context(|| path.clone())?;
            c.validate().with_context(|| path.clone())?;
            let targets: Vec<String> = c
                .controllers
                .iter()
                .map(|t| format!("{} (certificate name {:?})", t.addr, t.server_name))
                .collect();
            let s = format!(
                "switch agent: controller agents {}",
                targets.join(", then ")
            );
            (c.common, s)
        }
        Command::Controller(a) => {
            let workers = a.workers(&file).with_context(|| path.clone())?;
            let c = a.resolve(file).with_context(|| path.clone())?;
            c.validate().with_context(|| path.clone())?;
            let mut s = format!("controller agent: listens on UDP {}", c.listen);
            if let Some(n) = workers.filter(|&n| n > 1) {
                s += &format!(", {n} worker processes");
            }
            if let Some(id) = &c.server_id {
                s += &format!(", server id {id}");
            }
            (c.common, s)
        }
        _ => unreachable!("parsed as an agent command"),
    };
    println!("{path}: {summary}");
    for s in &common.services {
        println!(
            "  service {} ({}) at {}",
            s.name,
            s.framing.name(),
            s.target
        );
    }
    check_credentials(&common)?;
    if let Some(m) = common.metrics {
        println!("  metrics on http://{m}/metrics");
    }
    println!("{path}: OK");
    Ok(())
}

fn check_credentials(common: &CommonConfig) -> Result<()> {
    if let AgentTransport::Udp(_) = common.transport {
        println!("  transport udp: no certificates used (unauthenticated)");
        return Ok(());
    }
    let creds = Credentials::load(&common.tls)?;
    let now = time::OffsetDateTime::now_utc();
    println!(
        "  certificate {}: identity {:?}, serial {}, expires {}",
        common.tls.cert.display(),
        creds.identity,
        creds.serial,
        creds.not_after
    );
    if creds.not_after < now {
        bail!(
            "certificate {} expired at {}: peers will refuse it",
            common.tls.cert.display(),
            creds.not_after
        );
    }
    if creds.ca_not_after < now {
        bail!(
            "CA certificate {} expired at {}",
            common.tls.ca.display(),
            creds.ca_not_after
        );
    }
    Ok(())
}
