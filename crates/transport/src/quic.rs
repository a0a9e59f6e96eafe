//! QUIC endpoints for the agents (quinn), with the transport settings quicsdn
//! relies on.

use crate::resumption::SessionStore;
use crate::tls::{Credentials, TlsError};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Endpoint, EndpointConfig, IdleTimeout, TransportConfig, VarInt};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Transport settings shared by both agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuicOptions {
    /// Send a PING after this long without sending anything, so an idle control
    /// connection stays verified (RFC 9000 §10.1.2).
    pub keepalive: Duration,
    /// Declare the peer dead after this long without hearing from it (RFC 9000
    /// §10.1). Kept below Open vSwitch's default 2 × 5 s inactivity probe, so the
    /// agent notices a dead path before OVS would have, and closes OVS's
    /// connection truthfully.
    pub idle_timeout: Duration,
    /// How many streams of each kind (bidirectional: sessions; unidirectional:
    /// their further lanes) the peer may have open at once.
    pub max_streams: u32,
    /// Bytes the peer may send on one stream before we read them (its flow
    /// control window). It also bounds how much the peer's agent queues on one
    /// stream ahead of the wire: the latency a message behind a bulk transfer
    /// on the same stream can see is about this over the path's throughput.
    pub stream_window: u32,
    pub congestion: Congestion,
    /// 0-RTT resumption (RFC 9001 §4.6): the switch agent sends replay-safe
    /// messages with its first flight when it holds a ticket; the controller
    /// agent accepts them. See `quicsdn_lanes::early` for what may go early.
    pub zero_rtt: bool,
    /// Ask the peer to acknowledge less often (the QUIC ACK frequency extension,
    /// draft-ietf-quic-ack-frequency, which quinn implements on both ends); `None`
    /// keeps RFC 9000's behaviour (an ACK every second ack-eliciting packet, or after
    /// `max_ack_delay`, 25 ms). Fewer ACK-only packets, at the price of slower loss
    /// detection when the peer sends little.
    pub ack_frequency: Option<AckFrequency>,
    /// Switch side only: use zero-length connection IDs for this endpoint, so the
    /// controller agent's packets to the switch carry no destination connection ID
    /// (8 bytes less per packet). The switch agent has one connection, so it needs
    /// no connection ID to find it; its address and port identify it.
    pub zero_length_cid: bool,
}

/// The congestion controller (quinn's implementations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Congestion {
    /// CUBIC (RFC 9438), as Linux TCP uses by default.
    Cubic,
    /// NewReno (RFC 9002 §7).
    NewReno,
    /// BBR (quinn's implementation, marked experimental by quinn): it reads loss
    /// as loss, not as congestion, so random loss on a control link costs far
    /// less throughput. The default: under 2 % random loss quinn's CUBIC carried
    /// an eighth of what Linux TCP carried over the same link, BBR as much
    /// (docs/streams.md, "Congestion control").
    #[default]
    Bbr,
}

impl std::str::FromStr for Congestion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cubic" => Ok(Congestion::Cubic),
            "newreno" => Ok(Congestion::NewReno),
            "bbr" => Ok(Congestion::Bbr),
            _ => Err(format!(
                "unknown congestion controller {s:?}: use cubic, newreno or bbr"
            )),
        }
    }
}

/// See [`QuicOptions::ack_frequency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckFrequency {
    /// Ack-eliciting packets the peer may receive before it must acknowledge.
    pub threshold: u32,
    /// The longest the peer may delay an acknowledgement (quinn clamps it to at
    /// most the greater of the RTT and 25 ms); `None`: the peer's own.
    pub max_delay: Option<Duration>,
}

impl Default for QuicOptions {
    fn default() -> Self {
        QuicOptions {
            keepalive: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(6),
            max_streams: 4096,
            // quinn's default: 100 ms at 100 Mbit/s.
            stream_window: 1_250_000,
            congestion: Congestion::default(),
            zero_rtt: true,
            ack_frequency: None,
            zero_length_cid: false,
        }
    }
}

/// Socket buffer size asked for on the UDP socket: a burst of a thousand switches'
/// handshakes, or a flow-mod storm, must not overflow the kernel's default 208 kB.
const UDP_BUFFER: usize = 4 << 20;

fn transport_config(opts: &QuicOptions) -> Result<TransportConfig, TlsError> {
    let mut t = TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(opts.max_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(opts.max_streams))
        .stream_receive_window(VarInt::from_u32(opts.stream_window))
        .congestion_controller_factory(match opts.congestion {
            Congestion::Cubic => Arc::new(quinn::congestion::CubicConfig::default())
                as Arc<dyn quinn::congestion::ControllerFactory + Send + Sync>,
            Congestion::NewReno => Arc::new(quinn::congestion::NewRenoConfig::default()),
            Congestion::Bbr => Arc::new(quinn::congestion::BbrConfig::default()),
        })
        .keep_alive_interval(Some(opts.keepalive))
        .max_idle_timeout(Some(
            IdleTimeout::try_from(opts.idle_timeout)
                .map_err(|e| TlsError::Config(format!("idle timeout: {e}")))?,
        ));
    if let Some(af) = opts.ack_frequency {
        let mut cfg = quinn::AckFrequencyConfig::default();
        cfg.ack_eliciting_threshold(VarInt::from_u32(af.threshold))
            .max_ack_delay(af.max_delay);
        t.ack_frequency_config(Some(cfg));
    }
    Ok(t)
}

/// A UDP socket for an endpoint, bound to `addr`, with large buffers.
pub fn udp_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        // Accept IPv4-mapped peers on [::] as ovsdb-server and ovs-vswitchd do.
        let _ = socket.set_only_v6(false);
    }
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(UDP_BUFFER);
    let _ = socket.set_send_buffer_size(UDP_BUFFER);
    socket
        .bind(&addr.into())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind UDP {addr}: {e}")))?;
    Ok(socket.into())
}

fn runtime() -> io::Result<Arc<dyn quinn::Runtime>> {
    quinn::default_runtime().ok_or_else(|| io::Error::other("no async runtime (quinn needs tokio)"))
}

/// The error type of endpoint construction.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Session tickets the controller agent gives each connection. Every connection
/// attempt of a switch agent uses one, also those that never reach the
/// controller agent during an outage; rustls' client cache keeps 8.
pub const TICKETS_PER_CONNECTION: usize = 8;

/// The controller agent's endpoint: accepts connections from switch agents,
/// resuming their TLS sessions from `sessions`.
pub fn server_endpoint(
    listen: SocketAddr,
    creds: &Credentials,
    opts: &QuicOptions,
    sessions: Arc<SessionStore>,
) -> Result<Endpoint, EndpointError> {
    let mut tls = creds.server_config()?;
    tls.session_storage = sessions;
    tls.send_tls13_tickets = TICKETS_PER_CONNECTION;
    if opts.zero_rtt {
        // RFC 9001 §4.6.1: "the max_early_data_size parameter is repurposed to
        // hold a sentinel value 0xffffffff to indicate that the server is willing
        // to accept QUIC 0-RTT data".
        tls.max_early_data_size = u32::MAX;
    }
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Config(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(transport_config(opts)?));
    let socket = udp_socket(listen)?;
    Ok(Endpoint::new(
        EndpointConfig::default(),
        Some(server),
        socket,
        runtime()?,
    )?)
}

/// The switch agent's client configuration.
pub fn client_config(
    creds: &Credentials,
    opts: &QuicOptions,
) -> Result<quinn::ClientConfig, TlsError> {
    let mut tls = creds.client_config()?;
    // Tickets are kept by rustls' default in-memory cache (8 per server name).
    tls.enable_early_data = opts.zero_rtt;
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| TlsError::Config(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(Arc::new(transport_config(opts)?));
    Ok(client)
}

/// Zero-length connection IDs (RFC 9000 §5.1): for an endpoint with a single
/// connection, which its address identifies.
struct ZeroLengthCid;

impl quinn::ConnectionIdGenerator for ZeroLengthCid {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        quinn::ConnectionId::new(&[])
    }

    fn cid_len(&self) -> usize {
        0
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The switch agent's endpoint, bound to `bind` (port 0 picks one).
pub fn client_endpoint(
    bind: SocketAddr,
    creds: &Credentials,
    opts: &QuicOptions,
) -> Result<Endpoint, EndpointError> {
    let socket = udp_socket(bind)?;
    let mut config = EndpointConfig::default();
    if opts.zero_length_cid {
        config.cid_generator(|| Box::new(ZeroLengthCid));
    }
    let mut endpoint = Endpoint::new(config, None, socket, runtime()?)?;
    endpoint.set_default_client_config(client_config(creds, opts)?);
    Ok(endpoint)
}
