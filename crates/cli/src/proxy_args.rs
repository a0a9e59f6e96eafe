//! `quicsdn proxy server|client`: the TCP↔QUIC proxy's command line and
//! configuration file. The QUIC settings, credentials and logging options are
//! the agents' ([`QuicArgs`], the global `--log-level`), under the same names.

use crate::args::{QuicArgs, QuicFile, duration, host_of, load_toml, required};
use anyhow::{Result, anyhow, bail};
use clap::{Args, Subcommand};
use quicsdn_proxy::config::{self, Side, default_quic};
use quicsdn_proxy::{ClientConfig, Forward, ServerConfig};
use quicsdn_transport::quic::QuicOptions;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum ProxyCommand {
    /// The proxy server, beside the TCP servers: accepts proxy clients' QUIC
    /// connections and opens one TCP connection to a forward's target for each
    /// TCP connection a client carries.
    Server(ProxyServerArgs),
    /// The proxy client, beside the TCP clients: listens on each forward's
    /// ptcp: address and carries every accepted TCP connection to the proxy
    /// server as one stream of one QUIC connection.
    Client(ProxyClientArgs),
}

#[derive(Args, Debug)]
pub struct ProxyServerArgs {
    #[command(flatten)]
    pub quic: QuicArgs,
    /// UDP address to accept proxy clients on, e.g. 0.0.0.0:4433.
    #[arg(long, value_name = "IP:PORT")]
    pub listen: Option<SocketAddr>,
    /// A forward, NAME=tcp:HOST:PORT (repeatable): the target each TCP
    /// connection the clients carry for NAME is connected to.
    #[arg(long = "forward", value_name = "NAME=tcp:HOST:PORT")]
    pub forwards: Vec<String>,
    /// How long to wait for a target to accept a connection; then the
    /// client's TCP connection is reset. [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<String>,
}

#[derive(Args, Debug)]
pub struct ProxyClientArgs {
    #[command(flatten)]
    pub quic: QuicArgs,
    /// The proxy server, HOST:PORT (UDP).
    #[arg(long, value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// Name the proxy server's certificate must carry. [default: the host of
    /// --server]
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// Local UDP address to send from. [default: any address, any port]
    #[arg(long, value_name = "IP:PORT")]
    pub bind: Option<SocketAddr>,
    /// A forward, NAME=ptcp:PORT[:IP] (repeatable): accept TCP connections
    /// there (on 127.0.0.1 unless IP is given) and carry them to the server's
    /// forward of the same NAME.
    #[arg(long = "forward", value_name = "NAME=ptcp:PORT[:IP]")]
    pub forwards: Vec<String>,
    /// Longest wait between reconnection attempts. [default: 8s]
    #[arg(long, value_name = "DURATION")]
    pub max_backoff: Option<String>,
}

/// A proxy's configuration file: the flags' long names as keys.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ProxyFile {
    pub log_level: Option<String>,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub keepalive: Option<String>,
    pub grace: Option<String>,
    pub idle_timeout: Option<String>,
    pub stream_window: Option<String>,
    pub congestion: Option<String>,
    pub cert_poll_interval: Option<String>,
    pub forward: Option<Vec<String>>,
    // Server only.
    pub listen: Option<SocketAddr>,
    pub connect_timeout: Option<String>,
    // Client only.
    pub server: Option<String>,
    pub server_name: Option<String>,
    pub bind: Option<SocketAddr>,
    pub max_backoff: Option<String>,
}

impl ProxyFile {
    pub fn load(path: Option<&std::path::Path>) -> Result<ProxyFile> {
        load_toml(path)
    }

    fn quic_file(&mut self) -> QuicFile {
        QuicFile {
            ca: self.ca.take(),
            cert: self.cert.take(),
            key: self.key.take(),
            keepalive: self.keepalive.take(),
            grace: self.grace.take().or(self.idle_timeout.take()),
            stream_window: self.stream_window.take(),
            congestion: self.congestion.take(),
            cert_poll_interval: self.cert_poll_interval.take(),
        }
    }

    /// `--forward` flags replace the file's list.
    fn forwards(&mut self, flags: Vec<String>, side: Side) -> Result<Vec<Forward>> {
        let specs = if flags.is_empty() {
            self.forward.take().unwrap_or_default()
        } else {
            flags
        };
        Ok(specs
            .iter()
            .map(|s| Forward::parse(s, side))
            .collect::<Result<Vec<_>, _>>()?)
    }
}

/// The proxy's QUIC settings: flags over the file over the proxy's defaults.
/// Unless either sets the stream window, it follows the congestion
/// controller (quinn's gap limit, see `default_stream_window`).
fn proxy_quic(args: &mut QuicArgs, file: &mut QuicFile) -> Result<QuicOptions> {
    let window_given = args.stream_window.is_some() || file.stream_window.is_some();
    let mut q = args.quic_options(file, default_quic(), config::keepalive_for)?;
    if !window_given {
        q.stream_window = config::default_stream_window(q.congestion);
    }
    Ok(q)
}

impl ProxyServerArgs {
    pub fn resolve(mut self, mut file: ProxyFile) -> Result<ServerConfig> {
        if file.server.is_some()
            || file.server_name.is_some()
            || file.bind.is_some()
            || file.max_backoff.is_some()
        {
            bail!("`server`, `server-name`, `bind` and `max-backoff` are proxy client settings");
        }
        let mut qf = file.quic_file();
        let config = ServerConfig {
            listen: required(self.listen, file.listen.take(), "listen")?,
            tls: self.quic.tls_files(&mut qf)?,
            quic: proxy_quic(&mut self.quic, &mut qf)?,
            forwards: file.forwards(self.forwards, Side::Server)?,
            connect_timeout: duration(
                self.connect_timeout,
                file.connect_timeout.take(),
                "connect-timeout",
                Duration::from_secs(5),
            )?,
        };
        config.validate()?;
        Ok(config)
    }
}

impl ProxyClientArgs {
    pub fn resolve(mut self, mut file: ProxyFile) -> Result<ClientConfig> {
        if file.listen.is_some() || file.connect_timeout.is_some() {
            bail!("`listen` and `connect-timeout` are proxy server settings");
        }
        let server = required(self.server, file.server.take(), "server")?;
        if !server.contains(':') {
            bail!("--server {server:?}: expected HOST:PORT, e.g. 192.0.2.1:4433");
        }
        let server_name = self
            .server_name
            .or(file.server_name.take())
            .unwrap_or_else(|| host_of(&server).to_string());
        let mut qf = file.quic_file();
        let config = ClientConfig {
            server_name,
            server,
            bind: self.bind.or(file.bind.take()),
            tls: self.quic.tls_files(&mut qf)?,
            quic: proxy_quic(&mut self.quic, &mut qf)?,
            forwards: file.forwards(self.forwards, Side::Client)?,
            max_backoff: duration(
                self.max_backoff,
                file.max_backoff.take(),
                "max-backoff",
                Duration::from_secs(8),
            )?,
        };
        config.validate().map_err(|e| anyhow!(e))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;
    use quicsdn_transport::quic::Congestion;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("quicsdn").chain(args.iter().copied()))
    }

    fn server(args: &[&str], file: &str) -> Result<ServerConfig> {
        let mut v = vec!["proxy", "server"];
        v.extend(args);
        let Command::Proxy(ProxyCommand::Server(a)) = parse(&v)?.command else {
            panic!()
        };
        a.resolve(toml::from_str(file)?)
    }

    fn client(args: &[&str], file: &str) -> Result<ClientConfig> {
        let mut v = vec!["proxy", "client"];
        v.extend(args);
        let Command::Proxy(ProxyCommand::Client(a)) = parse(&v)?.command else {
            panic!()
        };
        a.resolve(toml::from_str(file)?)
    }

    const TLS: [&str; 3] = ["--ca=/p/ca.crt", "--cert=/p/x.crt", "--key=/p/x.key"];

    #[test]
    fn the_documented_command_lines_resolve() {
        let mut a = vec![
            "--listen",
            "0.0.0.0:4433",
            "--forward",
            "web=tcp:127.0.0.1:80",
        ];
        a.extend(TLS);
        let s = server(&a, "").unwrap();
        assert_eq!(s.listen.to_string(), "0.0.0.0:4433");
        assert_eq!(s.forwards[0].target.to_string(), "tcp:127.0.0.1:80");
        assert_eq!(s.quic.congestion, Congestion::BbrLt);
        assert!(!s.quic.zero_rtt);
        assert_eq!(s.quic.stream_window, 8 << 20);
        assert_eq!(
            (s.quic.idle_timeout, s.quic.keepalive),
            (Duration::from_secs(30), Duration::from_secs(5))
        );
        let mut a = vec![
            "--server",
            "192.0.2.1:4433",
            "--server-name",
            "proxy",
            "--forward",
            "web=ptcp:8080",
            "--forward=ssh=ptcp:2222:0.0.0.0",
            "--congestion",
            "cubic",
        ];
        a.extend(TLS);
        let c = client(&a, "").unwrap();
        assert_eq!(c.server_name, "proxy");
        assert_eq!(c.forwards.len(), 2);
        assert_eq!(c.forwards[1].target.to_string(), "ptcp:2222:0.0.0.0");
        assert_eq!(c.quic.congestion, Congestion::Cubic);
        // The other controllers keep the window below quinn's gap limit.
        assert_eq!(c.quic.stream_window, 4 << 20);
        assert_eq!(c.max_backoff, Duration::from_secs(8));
    }

    #[test]
    fn the_config_file_fills_in_and_flags_win() {
        let file = r#"
            server = "[2001:db8::1]:4433"
            ca = "/f/ca.crt"
            cert = "/f/c.crt"
            key = "/f/c.key"
            forward = ["web=ptcp:8080"]
            congestion = "newreno"
            grace = "3s"
            log-level = "debug"
        "#;
        let c = client(&["--cert=/cli/c.crt", "--forward=db=ptcp:5432"], file).unwrap();
        assert_eq!(c.server_name, "2001:db8::1");
        assert_eq!(c.tls.cert, PathBuf::from("/cli/c.crt"));
        assert_eq!(c.tls.ca, PathBuf::from("/f/ca.crt"));
        assert_eq!(c.quic.congestion, Congestion::NewReno);
        assert_eq!(c.quic.idle_timeout, Duration::from_secs(3));
        assert_eq!(c.quic.keepalive, Duration::from_millis(500));
        // A window given (here by the file) wins whatever the controller.
        let with_window = format!("{file}\nstream-window = \"2M\"");
        let c = client(&["--forward=db=ptcp:5432"], &with_window).unwrap();
        assert_eq!(c.quic.stream_window, 2 << 20);
        assert_eq!(c.forwards.len(), 1);
        assert_eq!(c.forwards[0].name, "db");
    }

    #[test]
    fn mistakes_are_named() {
        let e = |r: Result<ClientConfig>| r.unwrap_err().to_string();
        let mut a = vec!["--server=s:1", "--forward=web=tcp:1.2.3.4:80"];
        a.extend(TLS);
        assert!(e(client(&a, "")).contains("tcp: belongs on the proxy server"));
        let mut a = vec!["--server=s:1"];
        a.extend(TLS);
        assert!(e(client(&a, "")).contains("no forwards"));
        assert!(e(client(&["--server=s"], "")).contains("HOST:PORT"));
        let mut a = vec![
            "--server=s:1",
            "--forward=web=ptcp:80",
            "--congestion=vegas",
        ];
        a.extend(TLS);
        assert!(e(client(&a, "")).contains("--congestion"));
        assert!(
            e(client(&["--server=s:1", "--forward=w=ptcp:1"], "")).contains("--ca is required")
        );
        assert!(
            e(client(&["--server=s:1"], "listen = \"0.0.0.0:1\""))
                .contains("proxy server settings")
        );
        assert!(
            toml::from_str::<ProxyFile>("service = []")
                .unwrap_err()
                .to_string()
                .contains("service")
        );
        let mut a = vec!["--forward=web=ptcp:80"];
        a.extend(TLS);
        let err = server(&a, "").unwrap_err().to_string();
        assert!(err.contains("--listen is required"), "{err}");
        let mut a = vec!["--listen=0.0.0.0:1", "--forward=web=ptcp:80"];
        a.extend(TLS);
        let err = server(&a, "").unwrap_err().to_string();
        assert!(err.contains("ptcp: belongs on the proxy client"), "{err}");
    }
}
