//! `quicsdn`: the command-line front of the agents.

mod args;
mod check;
mod pcap;
mod proxy_args;
mod snoop;
mod systemd;
mod units;
mod workers;

use anyhow::Result;
use args::{Cli, Command, FileConfig, LogFormat, PkiCommand};
use clap::Parser;
use quicsdn_agent::udp::{UdpControllerAgent, UdpSwitchAgent};
use quicsdn_agent::{AgentTransport, ControllerAgent, SwitchAgent};
use quicsdn_transport::pki;
use quicsdn_transport::rotation::{Refusal, Reloaded};
use std::process::ExitCode;
use tracing::info;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quicsdn: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(level: &str, format: LogFormat) -> Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // `Targets` (a level, or `target=level` directives) rather than `EnvFilter`:
    // the same syntax for what the flag documents, without the regex engine
    // EnvFilter links in (about 0.5 MB of code every agent would map).
    let filter: tracing_subscriber::filter::Targets = level
        .parse()
        .map_err(|e| anyhow::anyhow!("--log-level {level:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // The builder's own ceiling is INFO: without this, `debug` and
        // `trace` directives in --log-level printed nothing.
        .with_max_level(tracing::level_filters::LevelFilter::TRACE)
        .with_target(false);
    match format {
        LogFormat::Text => builder.finish().with(filter).try_init()?,
        LogFormat::Json => builder.json().finish().with(filter).try_init()?,
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let log_level = |file: &FileConfig| {
        let level = cli.log_level.as_deref().or(file.log_level.as_deref());
        init_logging(level.unwrap_or("info"), cli.log_format)
    };
    match cli.command {
        Command::Pki(cmd) => pki_command(cmd),
        Command::Control(args) => control_command(args),
        Command::Snoop(args) => snoop::run(args),
        Command::CheckConfig(args) => check::run(args),
        Command::Switch(args) => {
            let file = FileConfig::load(args.common.quic.config.as_deref())?;
            log_level(&file)?;
            let config = args.resolve(file)?;
            // One connection to serve: a current-thread runtime unless told
            // otherwise (no worker threads, their stacks and malloc arenas).
            let threads = Some(cli.threads.unwrap_or(1));
            if let AgentTransport::Udp(profile) = config.common.transport {
                return runtime(threads)?.block_on(async {
                    let agent = UdpSwitchAgent::start(config, profile).await?;
                    systemd::ready("switch agent (udp)");
                    serve_until_stopped(|| async { no_credentials() }).await?;
                    systemd::stopping();
                    info!(switch = %agent.identity, "shutting down");
                    agent.shutdown().await;
                    Ok(())
                });
            }
            runtime(threads)?.block_on(async {
                let agent = SwitchAgent::start(config).await?;
                systemd::ready(&format!("switch agent {}", agent.identity()));
                serve_until_stopped(|| agent.reload_credentials()).await?;
                systemd::stopping();
                info!(switch = %agent.identity(), "shutting down");
                agent.shutdown().await;
                Ok(())
            })
        }
        Command::Proxy(cmd) => {
            proxy_command(cmd, cli.threads, cli.log_level.clone(), cli.log_format)
        }
        Command::Controller(args) => {
            let file = FileConfig::load(args.common.quic.config.as_deref())?;
            log_level(&file)?;
            let workers = args.workers(&file)?;
            let mut config = args.resolve(file)?;
            if !matches!(config.common.transport, AgentTransport::Quic) {
                if workers.is_some() {
                    anyhow::bail!("--workers: only for the QUIC transport");
                }
                if config.server_id.is_some() {
                    anyhow::bail!("--server-id: only for the QUIC transport");
                }
            }
            if let Some((index, socket)) = workers::from_env()? {
                workers::per_worker(&mut config, index)?;
                // One thread per worker unless told: workers are the cores.
                return runtime(Some(cli.threads.unwrap_or(1)))?.block_on(async {
                    let worker = quicsdn_agent::controller::Worker { socket, index };
                    let agent = ControllerAgent::start_worker(config, worker).await?;
                    serve_until_stopped(|| agent.reload_credentials()).await?;
                    info!(worker = index, "shutting down");
                    agent.shutdown_for_exit().await;
                    exit_after_controller_shutdown()
                });
            }
            if let Some(n) = workers.filter(|&n| n > 1) {
                return workers::supervise(n.into(), config.listen, config.server_id.as_ref());
            }
            if let AgentTransport::Udp(profile) = config.common.transport {
                return runtime(cli.threads)?.block_on(async {
                    let agent = UdpControllerAgent::start(config, profile).await?;
                    systemd::ready("controller agent (udp)");
                    serve_until_stopped(|| async { no_credentials() }).await?;
                    systemd::stopping();
                    info!("shutting down");
                    agent.shutdown().await;
                    Ok(())
                });
            }
            runtime(cli.threads)?.block_on(async {
                let agent = ControllerAgent::start(config).await?;
                systemd::ready(&format!("controller agent on {}", agent.local_addr()?));
                serve_until_stopped(|| agent.reload_credentials()).await?;
                systemd::stopping();
                info!("shutting down");
                agent.shutdown_for_exit().await;
                exit_after_controller_shutdown()
            })
        }
    }
}

/// Ends the process straight after `ControllerAgent::shutdown_for_exit`,
/// without returning through the runtime: dropping it would take every
/// connection's tasks and state down one by one, seconds at 10,000 switches
/// while this process still holds the port its successor needs.
fn exit_after_controller_shutdown() -> ! {
    std::process::exit(0)
}

/// `quicsdn proxy server|client`: runs until SIGINT or SIGTERM; SIGHUP
/// reloads the certificate files.
fn proxy_command(
    cmd: proxy_args::ProxyCommand,
    threads: Option<usize>,
    log_level: Option<String>,
    log_format: LogFormat,
) -> Result<()> {
    use proxy_args::{ProxyCommand, ProxyFile};
    let config_path = match &cmd {
        ProxyCommand::Server(a) => a.quic.config.clone(),
        ProxyCommand::Client(a) => a.quic.config.clone(),
    };
    let file = ProxyFile::load(config_path.as_deref())?;
    let level = log_level.as_deref().or(file.log_level.as_deref());
    init_logging(level.unwrap_or("info"), log_format)?;
    match cmd {
        ProxyCommand::Server(args) => {
            let config = args.resolve(file)?;
            runtime(threads)?.block_on(async {
                let proxy = quicsdn_proxy::ProxyServer::start(config).await?;
                serve_until_stopped(|| proxy.reload_credentials()).await?;
                info!("shutting down");
                proxy.shutdown().await;
                Ok(())
            })
        }
        ProxyCommand::Client(args) => {
            let config = args.resolve(file)?;
            runtime(threads)?.block_on(async {
                let proxy = quicsdn_proxy::ProxyClient::start(config).await?;
                serve_until_stopped(|| proxy.reload_credentials()).await?;
                info!("shutting down");
                proxy.shutdown().await;
                Ok(())
            })
        }
    }
}

fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    Ok(builder.enable_all().build()?)
}

type ReloadResult = Option<Result<Reloaded, Refusal>>;

/// Runs until SIGINT or SIGTERM. SIGHUP reads the CA, certificate and key
/// files again (`reload`, which logs what came of it) and carries on:
/// established connections stay up. systemd is told of the reload
/// (`RELOADING=1`, then `READY=1`), so `systemctl reload` reports it.
async fn serve_until_stopped<F, Fut>(reload: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ReloadResult>,
{
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => return Ok(r?),
            _ = term.recv() => return Ok(()),
            _ = hup.recv() => {
                systemd::reloading();
                // The outcome is logged by the rotation itself.
                let _ = reload().await;
                systemd::reloaded();
            }
        }
    }
}

/// SIGHUP to a `--transport udp` agent: it holds no certificates.
fn no_credentials() -> ReloadResult {
    info!("SIGHUP: --transport udp uses no certificates; nothing to reload");
    None
}

/// Sends one request to an agent's control socket and prints the answer.
fn control_command(args: args::ControlArgs) -> Result<()> {
    use std::io::{BufRead, BufReader, Write};
    let request = match args.request {
        args::ControlRequest::Status => serde_json::json!({"cmd": "status"}),
        args::ControlRequest::Rebind { bind } => serde_json::json!({"cmd": "rebind", "bind": bind}),
    };
    let mut stream = std::os::unix::net::UnixStream::connect(&args.socket)
        .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", args.socket.display()))?;
    writeln!(stream, "{request}")?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let answer: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| anyhow::anyhow!("the agent answered something unreadable ({e}): {line}"))?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    if answer["ok"] != true {
        anyhow::bail!(
            "{}",
            answer["error"]
                .as_str()
                .unwrap_or("the agent refused the request")
        );
    }
    Ok(())
}

fn pki_command(cmd: PkiCommand) -> Result<()> {
    match cmd {
        PkiCommand::Init { dir, name, days } => {
            let (crt, key) = pki::init_ca(&dir, &name, pki::Validity::days(days))?;
            println!("wrote {} and {}", crt.display(), key.display());
        }
        PkiCommand::Issue {
            dir,
            name,
            ips,
            days,
        } => {
            let (crt, key) = pki::issue(&dir, &name, &ips, pki::Validity::days(days))?;
            println!("wrote {} and {}", crt.display(), key.display());
        }
        PkiCommand::Import {
            ovs_pki,
            from,
            name,
            role,
            out,
        } => {
            use quicsdn_transport::ovs_pki::{AgentRole, import};
            let role = match role {
                args::ImportRole::Switch => AgentRole::Switch,
                args::ImportRole::Controller => AgentRole::Controller,
            };
            let done = import(&ovs_pki, &from, &name, role, &out)?;
            for w in &done.warnings {
                eprintln!("warning: {w}");
            }
            println!(
                "imported {:?} (serial {}); in the agent's configuration:",
                done.identity, done.serial
            );
            println!("ca = {:?}", done.files.ca.display().to_string());
            println!("cert = {:?}", done.files.cert.display().to_string());
            println!("key = {:?}", done.files.key.display().to_string());
            if role == AgentRole::Controller {
                println!("# the switch agents: server-name = {:?}", done.identity);
            }
        }
    }
    Ok(())
}
