//! QUIC endpoints for the agents (quinn), with the transport settings quicsdn
//! relies on.

use crate::resumption::SessionStore;
use crate::tls::{Application, Credentials, TlsError};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Endpoint, EndpointConfig, IdleTimeout, TransportConfig, VarInt};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Transport settings shared by both agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuicOptions {
    /// Send a PING after this long without hearing from the peer (quinn restarts
    /// the timer on every packet received), so an idle connection does not time
    /// out (RFC 9000 §10.1.2) and a NAT's mapping stays fresh. For the agents
    /// ([`agent_keepalive_for`]) just short of the idle timeout, so that Open
    /// vSwitch's own echo (every 5 s on an idle channel) keeps the connection
    /// alive and the PING goes only when OVS is silent; for the UDP
    /// transport half the idle timeout ([`keepalive_for`]); for the proxy a
    /// sixth (`quicsdn_proxy::config::keepalive_for`). Dead-peer detection is
    /// the idle timeout's, not this.
    pub keepalive: Duration,
    /// Declare the peer dead after this long without hearing from it (RFC 9000
    /// §10.1). Kept below Open vSwitch's default 2 × 5 s inactivity probe, so the
    /// agent notices a dead path before OVS would have, and closes OVS's
    /// connection truthfully.
    pub idle_timeout: Duration,
    /// How many streams of each kind the peer may have open at once. quinn
    /// keeps a table entry for every stream the peer may open (RFC 9000 §4.6
    /// MAX_STREAMS credit), so this is per-connection memory: the agents
    /// derive it from their stream mode and `--max-sessions`
    /// (`quicsdn_agent`'s `ServiceTable::stream_limits`).
    pub streams: StreamLimits,
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
    /// detection when the peer sends little. On by default
    /// ([`DEFAULT_ACK_FREQUENCY`]).
    pub ack_frequency: Option<AckFrequency>,
    /// Switch side only: use zero-length connection IDs for this endpoint, so the
    /// controller agent's packets to the switch carry no destination connection ID
    /// ([`DEFAULT_CID_LEN`] bytes less per packet). The switch agent has one
    /// connection per endpoint, so it needs no connection ID to find it; its
    /// address and port identify it. Off by default: quinn
    /// routes the controller agent's packets to such an endpoint by their
    /// sender's address alone, so a new connection to the same controller
    /// agent while the previous one still lingers (a controller agent restart)
    /// cannot share the endpoint with it: the switch agent opens a new
    /// endpoint (UDP port) for it (`quicsdn_agent`'s switch agent; before it
    /// did, 40 of 50 switch agents in the storm test needed a second
    /// connection, docs/benchmarks.md). Each such endpoint costs memory: in
    /// `bench storm` (1,000 switch agents, release build) the process grew by
    /// about 0.6 MiB per switch per controller-agent restart with it, and by
    /// under 0.05 MiB without it, for a saving of 4 bytes per packet.
    /// Callers that reconnect on one endpoint (the proxy) must leave it off.
    pub zero_length_cid: bool,
    /// Length in bytes of the connection IDs this endpoint issues, which every
    /// short-header packet the peer sends to it carries (RFC 9000 §17.3.1).
    /// [`DEFAULT_CID_LEN`] by default; see [`CID_LENS`].
    pub cid_len: usize,
    /// Mark packets ECT(0) and report ECN counts in ACK frames (RFC 9000
    /// §13.4). Off by default for the agents: the counters cost 3–6 bytes in
    /// every ACK frame, and TCP, the baseline, runs without ECN here
    /// ([`crate::no_ecn`], docs/benchmarks.md).
    pub ecn: bool,
    /// What the connection carries (its ALPN name, and what logs call each end).
    pub application: Application,
    /// How often the CA, certificate and key files are checked for a new
    /// version ([`crate::rotation`]); `None`: only on SIGHUP. Not a QUIC
    /// setting, but every end that makes QUIC connections takes it.
    pub cert_poll: Option<Duration>,
}

/// Streams the peer may have open at once (RFC 9000 §4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Bidirectional: the control stream and one per session.
    pub bidi: u32,
    /// Unidirectional: the further lanes of sessions.
    pub uni: u32,
}

impl Default for StreamLimits {
    /// What the agents' defaults need: 8 sessions in `safe` mode with
    /// OpenFlow (9 further lanes each) and the control stream.
    fn default() -> Self {
        StreamLimits {
            bidi: 9,
            uni: 8 * 9,
        }
    }
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
    /// BBR's model without quinn's BBR's loss reactions, crediting random
    /// loss up to 25 % to its bandwidth estimate
    /// ([`crate::loss_tolerant_bbr`]). The proxy's default (bulk data over
    /// lossy paths, docs/proxy.md); not the agents', whose small control
    /// messages it has not been measured with.
    BbrLt,
}

impl std::str::FromStr for Congestion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cubic" => Ok(Congestion::Cubic),
            "newreno" => Ok(Congestion::NewReno),
            "bbr" => Ok(Congestion::Bbr),
            "bbr-lt" => Ok(Congestion::BbrLt),
            _ => Err(format!(
                "unknown congestion controller {s:?}: use cubic, newreno, bbr or bbr-lt"
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
    /// most the greater of the RTT and 25 ms: [`requested_ack_delay`]); `None`:
    /// the peer's own (25 ms).
    pub max_delay: Option<Duration>,
}

/// The ACK frequency the agents ask for by default: an ACK every 17th
/// ack-eliciting packet, or after at most the path's RTT (at least 25 ms, at most
/// [`AUTO_ACK_DELAY_CAP`]): see [`requested_ack_delay`]. Loss recovery is not
/// slowed: the agents ask for a reordering threshold of 1 ([`REORDERING_THRESHOLD`]),
/// so the first packet after a gap is acknowledged at once, as without the
/// extension, and probes carry IMMEDIATE_ACK (draft-ietf-quic-ack-frequency §5).
/// 16 is what `bench tuning` measured (docs/benchmarks.md).
pub const DEFAULT_ACK_FREQUENCY: AckFrequency = AckFrequency {
    threshold: 16,
    max_delay: Some(AUTO_ACK_DELAY_CAP),
};

/// The reordering threshold the agents ask of the peer with the ACK frequency
/// extension. In draft-ietf-quic-ack-frequency (§4, §6.2; quinn implements
/// draft 04) 1 is the value without the extension, RFC 9000 §13.2.1's rule:
/// "an endpoint SHOULD generate and send an ACK frame without delay when it
/// receives an ack-eliciting packet [...] when the packet has a packet number
/// larger than the highest-numbered ack-eliciting packet that has been
/// received and there are missing packets between that packet and this
/// packet". quinn's default, 2, waits for the second packet after a gap: on a
/// sparse stream (PACKET_INs 10 ms apart) that is one message later, and a
/// lost message, with every message queued behind it, is retransmitted that
/// much later (`bench hol`, packet-in at 1 % loss). An extra ACK only when
/// packets arrive out of order costs nothing measurable on the control link.
pub const REORDERING_THRESHOLD: u32 = 1;

/// `--ack-delay auto`, the default: the longest ACK delay the agents ask of the
/// peer. quinn lowers the request to the path's smoothed RTT, and raises it to
/// no less than 25 ms (`candidate_max_ack_delay`), and sends a new ACK_FREQUENCY
/// frame whenever that value drifts by more than 20 % (the RTT changed), so the
/// request follows the RTT: 25 ms on a LAN (the peer's own `max_ack_delay`,
/// what RFC 9000 gives anyway) and the RTT on a WAN, up to this cap.
///
/// Why the RTT: at a few messages per second each way, an ACK that may wait
/// one RTT usually rides on the next message the other way instead of leaving
/// in a packet of its own (at 10 msg/s, 78 % of the time within 150 ms, 22 %
/// within 25 ms). The price is tail-loss recovery:
/// RFC 9002 §6.2.1, "PTO = smoothed_rtt + max(4*rttvar, kGranularity) +
/// max_ack_delay", so a lost packet that nothing follows is retransmitted up
/// to (RTT − 25 ms) later, about one RTT. On a short RTT nothing changes (25 ms
/// either way), and a loss followed by any packet is still found by the
/// packet threshold at once. Why a cap: above it (satellite paths) the PTO,
/// and the idle timer it feeds (quinn's is at least 3 PTOs), would keep
/// growing with the RTT, further past the 750 ms margin that
/// [`agent_keepalive_for`] leaves for a lost PING's retransmission.
pub const AUTO_ACK_DELAY_CAP: Duration = Duration::from_millis(200);

/// The ACK delay quinn 0.11 asks of a quinn peer for `max_delay` (`None`: the
/// peer's own `max_ack_delay`, 25 ms) at smoothed RTT `rtt`: the request, but
/// no more than the larger of the RTT and 25 ms, and no less than the peer's
/// `min_ack_delay` (1 ms) (quinn-proto's `candidate_max_ack_delay`, which
/// does the adapting; this restates its rule so that the agents' choice of
/// cap can be checked against paths). What `--ack-delay` buys on a given path.
pub fn requested_ack_delay(max_delay: Option<Duration>, rtt: Duration) -> Duration {
    const QUINN_RTT_FLOOR: Duration = Duration::from_millis(25);
    const QUINN_MIN_ACK_DELAY: Duration = Duration::from_millis(1);
    max_delay
        .unwrap_or(QUINN_RTT_FLOOR)
        .min(rtt.max(QUINN_RTT_FLOOR))
        .max(QUINN_MIN_ACK_DELAY)
}

/// The connection ID length the agents issue by default: 4 bytes instead of
/// quinn's 8, 4 bytes less in every packet either way. Still a non-zero
/// length, so quinn routes by connection ID and not by address alone. The
/// switch agent's own IDs have this length too, unless
/// `--zero-length-cid` makes them zero-length ([`QuicOptions::zero_length_cid`],
/// off by default). Enough for either side: the switch agent has a
/// connection or two, with 8 IDs each; the controller agent's are 4 random
/// bytes (4 G values; quinn draws again on a collision with its own), and
/// longer ones add a keyed check ([`KeyedConnectionIdGenerator`]).
pub const DEFAULT_CID_LEN: usize = 4;

/// The connection ID lengths the agents accept (`--cid-len`).
pub const CID_LENS: std::ops::RangeInclusive<usize> = 4..=8;

/// The keepalive for an idle timeout when nothing else keeps the connection
/// busy (the UDP transport's liveness probes): half of it, the other half for
/// a lost PING's retransmission.
pub fn keepalive_for(idle_timeout: Duration) -> Duration {
    idle_timeout / 2
}

/// The agents' keepalive for an idle timeout (the grace period): an eighth of
/// it, at least 750 ms, before it ends (5.25 s with the default 6 s), but never
/// less than half of it.
///
/// Why: Open vSwitch probes an idle OpenFlow (and OVSDB) connection with an
/// echo request after 5 s without hearing from the controller, and the reply
/// comes back through the agents, so on an idle channel each agent hears from
/// the other at least every 5 s plus an RTT. A keepalive longer than that
/// sends no PING while OVS echoes; one of 3 s (half the grace period) sent a
/// PING and its ACK in every echo cycle, 65 % more idle packets than TCP in
/// the demo, against 4 % more with 5.25 s (docs/benchmarks.md). The PING still
/// goes when OVS is silent (probes off, or a lost echo), and the last 750 ms
/// leave room for PTO retransmissions of it at a short RTT (quinn's idle
/// timer is also at least 3 PTOs); dead-peer detection stays the idle
/// timeout's. On a lossy long-RTT link with OVS's probes off, a shorter
/// `--keepalive` (e.g. half of `--grace`) is the safer choice.
pub fn agent_keepalive_for(idle_timeout: Duration) -> Duration {
    let margin = (idle_timeout / 8).max(Duration::from_millis(750));
    idle_timeout.saturating_sub(margin).max(idle_timeout / 2)
}

impl Default for QuicOptions {
    fn default() -> Self {
        let idle_timeout = Duration::from_secs(6);
        QuicOptions {
            keepalive: agent_keepalive_for(idle_timeout),
            idle_timeout,
            streams: StreamLimits::default(),
            // quinn's default: 100 ms at 100 Mbit/s.
            stream_window: 1_250_000,
            congestion: Congestion::default(),
            zero_rtt: true,
            ack_frequency: Some(DEFAULT_ACK_FREQUENCY),
            // See the field's documentation.
            zero_length_cid: false,
            cid_len: DEFAULT_CID_LEN,
            ecn: false,
            application: crate::tls::AGENTS,
            cert_poll: Some(crate::rotation::DEFAULT_POLL),
        }
    }
}

/// Socket buffer size asked for on the UDP socket: a burst of a thousand switches'
/// handshakes, or a flow-mod storm, must not overflow the kernel's default 208 kB.
const UDP_BUFFER: usize = 4 << 20;

/// The transport settings of every connection (a qlog stream is added per
/// connection, see [`Qlog`]).
pub fn transport_config(opts: &QuicOptions) -> Result<TransportConfig, TlsError> {
    let mut t = TransportConfig::default();
    // Every stream the peer may open has its window, so this is the most the
    // peer can make us buffer on one connection (quinn's default: no limit
    // beyond the streams').
    let window_bound = (u64::from(opts.streams.bidi) + u64::from(opts.streams.uni))
        * u64::from(opts.stream_window);
    t.max_concurrent_bidi_streams(VarInt::from_u32(opts.streams.bidi))
        .max_concurrent_uni_streams(VarInt::from_u32(opts.streams.uni))
        .stream_receive_window(VarInt::from_u32(opts.stream_window))
        .receive_window(VarInt::from_u64(window_bound).unwrap_or(VarInt::MAX))
        // The agents send no QUIC DATAGRAM frames (RFC 9221): don't offer to
        // buffer any.
        .datagram_receive_buffer_size(None)
        .congestion_controller_factory(match opts.congestion {
            Congestion::Cubic => Arc::new(quinn::congestion::CubicConfig::default())
                as Arc<dyn quinn::congestion::ControllerFactory + Send + Sync>,
            Congestion::NewReno => Arc::new(quinn::congestion::NewRenoConfig::default()),
            Congestion::Bbr => Arc::new(quinn::congestion::BbrConfig::default()),
            Congestion::BbrLt => {
                Arc::new(crate::loss_tolerant_bbr::LossTolerantBbrConfig::default())
            }
        })
        .keep_alive_interval(Some(opts.keepalive))
        .max_idle_timeout(Some(
            IdleTimeout::try_from(opts.idle_timeout)
                .map_err(|e| TlsError::Config(format!("idle timeout: {e}")))?,
        ));
    if let Some(af) = opts.ack_frequency {
        let mut cfg = quinn::AckFrequencyConfig::default();
        cfg.ack_eliciting_threshold(VarInt::from_u32(af.threshold))
            .max_ack_delay(af.max_delay)
            .reordering_threshold(VarInt::from_u32(REORDERING_THRESHOLD));
        t.ack_frequency_config(Some(cfg));
    }
    Ok(t)
}

/// A UDP socket for an endpoint, bound to `addr`, with large buffers.
pub fn udp_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    udp_socket_with(addr, false)
}

/// [`udp_socket`], joining `addr`'s `SO_REUSEPORT` group if `reuse_port`
/// (see [`crate::reuseport`]).
pub fn udp_socket_with(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
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

/// The controller agent's UDP receive buffer. After a controller-agent
/// restart every switch agent sends its Initial (1,200 bytes or more, RFC 9000
/// §14.1) and 0-RTT packets at once; the kernel charges each about 2.3 KiB
/// (the datagram and its buffer head), so net.core.rmem_max's 4 MiB here (8 MiB
/// as the kernel doubles it) held ~3,500 of them and 10,000 switches lost
/// 280,000–570,000 datagrams per restart (docs/results/storm-10000). 64 MiB
/// holds ~28,000. The memory is taken only while datagrams wait.
pub const SERVER_UDP_RECV_BUFFER: usize = 64 << 20;

/// Raises `socket`'s receive buffer to `bytes`: `SO_RCVBUFFORCE`, which
/// ignores net.core.rmem_max, when the process may (root or CAP_NET_ADMIN),
/// else `SO_RCVBUF`, which the kernel caps at net.core.rmem_max. Returns what
/// the kernel granted (it reports twice the request: its bookkeeping) and
/// logs once when that is less than asked, naming the sysctl to raise.
pub fn grow_recv_buffer(socket: &std::net::UdpSocket, bytes: usize) -> usize {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fd` is an open socket for the call; the option value is a
    // c_int of the size passed.
    let forced = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } == 0;
    let sock = socket2::SockRef::from(socket);
    if !forced {
        let _ = sock.set_recv_buffer_size(bytes);
    }
    let granted = sock.recv_buffer_size().unwrap_or(0);
    if granted < bytes {
        tracing::warn!(
            asked = bytes,
            granted,
            "UDP receive buffer smaller than asked (no CAP_NET_ADMIN for SO_RCVBUFFORCE, and \
             net.core.rmem_max caps SO_RCVBUF): a restart storm of thousands of switches may \
             overflow it; raise net.core.rmem_max (sysctl -w net.core.rmem_max={bytes})"
        );
    }
    granted
}

fn runtime() -> io::Result<Arc<dyn quinn::Runtime>> {
    quinn::default_runtime().ok_or_else(|| io::Error::other("no async runtime (quinn needs tokio)"))
}

/// `socket` as quinn's endpoint socket, with ECN or without it
/// ([`QuicOptions::ecn`], [`crate::no_ecn`]). For new endpoints and for
/// `Endpoint::rebind_abstract` alike, so a migration keeps the setting.
pub fn endpoint_socket(
    socket: std::net::UdpSocket,
    ecn: bool,
) -> io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
    let socket = runtime()?.wrap_udp_socket(socket)?;
    Ok(if ecn {
        socket
    } else {
        Arc::new(crate::tapped::Tapped {
            inner: socket,
            tap: crate::no_ecn::NoEcn,
        })
    })
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
/// controller agent during an outage or are refused; once they are used up the
/// next attempt is a full handshake, which brings new ones. The controller
/// agent keeps each ticket's session (about 1 KiB with the switch's
/// certificate, 0.4 KiB since the store keeps the certificate once per
/// switch) until it is used or expires: 8 were 7.7 KiB per switch, an eighth
/// of an idle connection's memory (issue 18), so 4.
pub const TICKETS_PER_CONNECTION: usize = 4;

/// `--qlog-dir`: one qlog file per QUIC connection, in the JSON-SEQ format
/// (`.sqlog`, draft-ietf-quic-qlog-main-schema) that qvis reads, written by
/// quinn's own qlog support.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qlog {
    pub dir: PathBuf,
}

impl Qlog {
    /// Opens `DIR/NAME.sqlog` and a qlog stream writing to it, line by line.
    pub fn open(&self, name: &str, title: &str) -> io::Result<(quinn::QlogStream, PathBuf)> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("{name}.sqlog"));
        let file = std::fs::File::create(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let mut cfg = quinn::QlogConfig::default();
        cfg.writer(Box::new(io::LineWriter::new(file)))
            .title(Some(title.to_string()));
        let stream = cfg.into_stream().ok_or_else(|| {
            io::Error::other(format!("{}: cannot start the qlog", path.display()))
        })?;
        Ok((stream, path))
    }

    /// `opts`' transport settings with a qlog stream to `DIR/NAME.sqlog`.
    pub fn transport(
        &self,
        opts: &QuicOptions,
        name: &str,
        title: &str,
    ) -> Result<(Arc<TransportConfig>, PathBuf), EndpointError> {
        let (stream, path) = self.open(name, title)?;
        let mut t = transport_config(opts)?;
        t.qlog_stream(Some(stream));
        Ok((Arc::new(t), path))
    }
}

/// A file-name-safe form of an identity or address.
pub fn file_stem(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The controller agent's endpoint: accepts connections from switch agents,
/// resuming their TLS sessions from `sessions`. Also returns the server
/// configuration, for connections accepted with settings of their own (qlog).
pub fn server_endpoint(
    listen: SocketAddr,
    creds: &Credentials,
    opts: &QuicOptions,
    sessions: Arc<SessionStore>,
) -> Result<(Endpoint, quinn::ServerConfig), EndpointError> {
    let served = server_endpoint_on(udp_socket(listen)?, None, creds, opts, sessions, None)?;
    Ok((served.endpoint, served.config))
}

/// What [`server_endpoint_on`] returns.
pub struct ServerEndpoint {
    pub endpoint: Endpoint,
    /// The server configuration, for connections accepted with settings of
    /// their own (qlog).
    pub config: quinn::ServerConfig,
    /// The switch agents recorded for a successor ([`crate::roster`]), when
    /// a roster file was given; the caller writes it every round.
    pub roster: Option<Arc<crate::roster::Roster>>,
    /// The switch agents a predecessor recorded in that file, for the caller
    /// to reset at its pace.
    pub predecessors: Option<crate::roster::Predecessors>,
}

/// [`server_endpoint`] on a socket opened beforehand, and with connection IDs
/// that start with a `routing` prefix ([`crate::quic_lb`]: the host's
/// server id for a QUIC-LB balancer, then the worker's octet for a reuseport
/// group, [`crate::quic_lb::ServerId::prefix`]). All agents on one address
/// derive the same keys (stateless reset, connection-ID check,
/// address-validation tokens) from the private key and that address; their
/// prefixes keep their IDs apart, so an agent neither claims nor resets
/// another's connections.
///
/// With a `roster` file, records this agent's switch agents and returns
/// those a predecessor on this address recorded there ([`crate::roster`]).
pub fn server_endpoint_on(
    socket: std::net::UdpSocket,
    routing: Option<&[u8]>,
    creds: &Credentials,
    opts: &QuicOptions,
    sessions: Arc<SessionStore>,
    roster: Option<&Path>,
) -> Result<ServerEndpoint, EndpointError> {
    let listen = socket.local_addr()?;
    grow_recv_buffer(&socket, SERVER_UDP_RECV_BUFFER);
    let server = server_config(creds, opts, sessions)?;
    let keys = RestartStableKeys::new(creds, listen);
    let mut config = EndpointConfig::new(keys.stateless_reset());
    // The predecessor's switch agents, first: the IDs they still send to are
    // never issued here (`roster::NotTaken`).
    let predecessors = match roster {
        Some(path) => {
            let (predecessors, bad) = crate::roster::Predecessors::load(
                path,
                keys.stateless_reset(),
                socket.try_clone()?,
            )
            .map_err(|e| io::Error::new(e.kind(), format!("roster {}: {e}", path.display())))?;
            if bad > 0 {
                tracing::warn!(
                    roster = %path.display(),
                    lines = bad,
                    "roster lines not understood, skipped"
                );
            }
            predecessors
        }
        None => None,
    };
    let taken: Arc<std::collections::HashSet<quinn::ConnectionId>> = Arc::new(
        predecessors
            .as_ref()
            .map(|p| p.cids().cloned().collect())
            .unwrap_or_default(),
    );
    let cid_key = keys.connection_ids();
    let cid_len = opts.cid_len;
    let issued_len = match routing {
        None => {
            config.cid_generator(move || {
                Box::new(crate::roster::NotTaken::new(
                    KeyedConnectionIdGenerator::new(cid_key, cid_len),
                    taken.clone(),
                ))
            });
            quinn::ConnectionIdGenerator::cid_len(&KeyedConnectionIdGenerator::new(
                cid_key, cid_len,
            ))
        }
        Some(prefix) => {
            let checked = crate::quic_lb::ServerIdCidGenerator::new(
                crate::reuseport::CONFIG_ROTATION,
                prefix,
                cid_key,
            )
            .map_err(|e| TlsError::Config(e.to_string()))?;
            let len = quinn::ConnectionIdGenerator::cid_len(&checked);
            let prefix = prefix.to_vec();
            // Checked above, so this cannot fail.
            config.cid_generator(move || {
                Box::new(crate::roster::NotTaken::new(
                    crate::quic_lb::ServerIdCidGenerator::new(
                        crate::reuseport::CONFIG_ROTATION,
                        &prefix,
                        cid_key,
                    )
                    .expect("checked above"),
                    taken.clone(),
                ))
            });
            len
        }
    };
    // After a crash every switch agent lost contact at the same instant, so
    // their probes arrive together; quinn's default of one reset per 20 ms
    // answered a few per burst and left the rest to their grace period. No
    // limit instead: RFC 9000 §10.3.3 "An endpoint MUST ensure that every
    // Stateless Reset that it sends is smaller than the packet that triggered
    // it" (quinn does), so it amplifies nothing, and only a packet whose
    // connection ID passes the keyed check below earns one.
    config.min_reset_interval(Duration::ZERO);
    // The predecessor's file stays until this agent's first switch is
    // recorded: should this agent crash before any comes back, its successor
    // resets them again.
    let roster = roster.map(|_| Arc::new(crate::roster::Roster::new(issued_len)));
    let udp = match &roster {
        Some(roster) => Arc::new(crate::tapped::Tapped {
            inner: endpoint_socket(socket, opts.ecn)?,
            tap: roster.clone(),
        }),
        None => endpoint_socket(socket, opts.ecn)?,
    };
    let endpoint =
        Endpoint::new_with_abstract_socket(config, Some(server.clone()), udp, runtime()?)?;
    Ok(ServerEndpoint {
        endpoint,
        config: server,
        roster,
        predecessors,
    })
}

/// The controller agent's server configuration (TLS and transport).
pub fn server_config(
    creds: &Credentials,
    opts: &QuicOptions,
    sessions: Arc<SessionStore>,
) -> Result<quinn::ServerConfig, TlsError> {
    let mut tls = creds.server_config_for(opts.application)?;
    // Off unless SSLKEYLOGFILE or a `snoop --keylog` asks (loudly).
    tls.key_log = crate::keylog::hub();
    tls.session_storage = sessions;
    tls.send_tls13_tickets = TICKETS_PER_CONNECTION;
    if opts.zero_rtt {
        // RFC 9001 §4.6.1: "the max_early_data_size parameter is repurposed to
        // hold a sentinel value 0xffffffff to indicate that the server is willing
        // to accept QUIC 0-RTT data".
        tls.max_early_data_size = u32::MAX;
    }
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Config(e.to_string()))?;
    // Address-validation tokens (Retry and NEW_TOKEN, RFC 9000 §8.1) keyed
    // from the private key, not drawn at random: a token one worker of a
    // reuseport group (or a predecessor) issued is valid at any other, so a
    // switch that reconnects skips the address validation round trip
    // whichever worker its handshake reaches.
    let mut server = quinn::ServerConfig::new(
        Arc::new(crypto),
        Arc::new(RestartStableKeys::token_key(creds)),
    );
    server.transport_config(Arc::new(transport_config(opts)?));
    Ok(server)
}

/// The controller agent's keys that must outlive it, so that an agent
/// restarted after a crash (on the same address, with the same private key)
/// answers the packets of its predecessor's connections with stateless resets
/// the switch agents accept, and they reconnect at once instead of at the end
/// of their grace period (RFC 9000 §10.3: "A crash or outage might result in
/// peers continuing to send data to an endpoint that is unable to properly
/// continue the connection."). Two are needed: the stateless-reset key (§10.3.2), and the key of
/// quinn's connection-ID check, which otherwise drops a packet for a
/// connection ID the new agent did not issue before considering a reset.
///
/// Both are derived (HKDF-SHA256, RFC 5869) from the private key and the
/// listen address instead of drawn at random. The address is in the
/// derivation because §10.3.2 warns against endpoints sharing a static key:
/// two controller agents with one certificate on two addresses get different
/// keys. Only a holder of the private key, who could impersonate the agent
/// anyway, can compute them.
struct RestartStableKeys {
    prk: ring::hkdf::Prk,
    address: String,
}

/// An HKDF output length, for ring.
struct Len(usize);

impl ring::hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl RestartStableKeys {
    fn new(creds: &Credentials, listen: SocketAddr) -> Self {
        RestartStableKeys {
            prk: Self::master(creds),
            address: listen.to_string(),
        }
    }

    /// The pseudorandom key every restart-stable key is expanded from.
    fn master(creds: &Credentials) -> ring::hkdf::Prk {
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"quicsdn controller agent v1");
        salt.extract(creds.private_key_der())
    }

    fn stateless_reset(&self) -> Arc<dyn quinn::crypto::HmacKey> {
        let info = [b"stateless reset".as_slice(), self.address.as_bytes()];
        let okm = self
            .prk
            .expand(&info, ring::hmac::HMAC_SHA256)
            .expect("HMAC-SHA256's key length is a valid HKDF-SHA256 output length");
        Arc::new(ring::hmac::Key::from(okm))
    }

    /// The address-validation token key: one per private key, whatever the
    /// address (a token is only ever checked by the issuer's own key).
    fn token_key(creds: &Credentials) -> ring::hkdf::Prk {
        let mut key = [0u8; 32];
        Self::master(creds)
            .expand(&[b"address validation tokens".as_slice()], Len(key.len()))
            .and_then(|okm| okm.fill(&mut key))
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &[]).extract(&key)
    }

    fn connection_ids(&self) -> u64 {
        let info = [b"connection ids".as_slice(), self.address.as_bytes()];
        let mut key = [0u8; 8];
        self.prk
            .expand(&info, Len(key.len()))
            .and_then(|okm| okm.fill(&mut key))
            .expect("8 bytes is a valid HKDF-SHA256 output length");
        u64::from_le_bytes(key)
    }
}

/// The controller agent's connection IDs: a random nonce of [`CID_NONCE_LEN`]
/// bytes, and for IDs longer than that a keyed check of the rest (like
/// quinn's `HashedConnectionIdGenerator`, which is fixed at 8 bytes), so that
/// a restarted agent tells its predecessor's IDs (stateless reset, RFC 9000
/// §10.3) from junk. The check is a cheap filter, not a secret: at the
/// default 4 bytes there is none, and any packet with an unknown 4-byte ID
/// earns a stateless reset, which is always smaller than the packet
/// (§10.3.3), so it amplifies nothing.
pub struct KeyedConnectionIdGenerator {
    key: u64,
    len: usize,
}

/// The random part of [`KeyedConnectionIdGenerator`]'s IDs: 4 G values, all
/// of a default 4-byte ID. Not fewer: a restarted agent draws its IDs from the
/// same space as its predecessor, and a switch agent that still sends on a
/// predecessor's connection to an ID the new agent has issued to another
/// switch is routed to that connection, where its packets fail to decrypt
/// and are dropped: no stateless reset tells it that the connection is
/// gone, and it waits out its idle timeout. With 3 random bytes (16 M values)
/// and ~50,000 IDs issued after a restart of 10,000 switches, 6–10 of them
/// did so in each measured restart and came back after 33–42 s instead of
/// within 15 s (docs/results/storm-10000-stop); with 4, about 0.1 are
/// expected per such restart.
const CID_NONCE_LEN: usize = 4;

impl KeyedConnectionIdGenerator {
    /// IDs of `len` bytes, clamped to [`CID_LENS`].
    pub fn new(key: u64, len: usize) -> Self {
        KeyedConnectionIdGenerator {
            key,
            len: len.clamp(*CID_LENS.start(), *CID_LENS.end()),
        }
    }

    fn check(&self, nonce: &[u8]) -> [u8; 8] {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys; the secret is hashed in with the nonce.
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new();
        self.key.hash(&mut h);
        nonce.hash(&mut h);
        h.finish().to_le_bytes()
    }
}

impl quinn::ConnectionIdGenerator for KeyedConnectionIdGenerator {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let mut id = [0u8; 8];
        id[..CID_NONCE_LEN].copy_from_slice(&rand::random::<[u8; CID_NONCE_LEN]>());
        let check = self.check(&id[..CID_NONCE_LEN]);
        id[CID_NONCE_LEN..self.len].copy_from_slice(&check[..self.len - CID_NONCE_LEN]);
        quinn::ConnectionId::new(&id[..self.len])
    }

    fn validate(&self, cid: &quinn::ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        if cid.len() != self.len {
            return Err(quinn_proto::InvalidCid);
        }
        let (nonce, check) = cid.split_at(CID_NONCE_LEN);
        if self.check(nonce)[..check.len()] == *check {
            Ok(())
        } else {
            Err(quinn_proto::InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        self.len
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The switch agent's client configuration.
pub fn client_config(
    creds: &Credentials,
    opts: &QuicOptions,
) -> Result<quinn::ClientConfig, TlsError> {
    let mut tls = creds.client_config_for(opts.application)?;
    // Off unless SSLKEYLOGFILE or a `snoop --keylog` asks (loudly).
    tls.key_log = crate::keylog::hub();
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
    let mut endpoint = client_endpoint_for_connect_with(bind, opts)?;
    endpoint.set_default_client_config(client_config(creds, opts)?);
    Ok(endpoint)
}

/// [`client_endpoint`] without a default client configuration, for callers
/// that pass their own to `Endpoint::connect_with` (the switch agent keeps one
/// per controller agent, with its session tickets). With zero-length
/// connection IDs the switch agent opens one of these per connection while an
/// earlier connection still lingers: see [`QuicOptions::zero_length_cid`].
pub fn client_endpoint_for_connect_with(
    bind: SocketAddr,
    opts: &QuicOptions,
) -> Result<Endpoint, EndpointError> {
    let socket = udp_socket(bind)?;
    let mut config = EndpointConfig::default();
    if opts.zero_length_cid {
        config.cid_generator(|| Box::new(ZeroLengthCid));
    } else {
        let cid_len = opts.cid_len;
        config.cid_generator(move || {
            Box::new(quinn_proto::RandomConnectionIdGenerator::new(cid_len))
        });
    }
    Ok(Endpoint::new_with_abstract_socket(
        config,
        None,
        endpoint_socket(socket, opts.ecn)?,
        runtime()?,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::test_credentials as creds;
    use crate::tls::TlsFiles;

    #[test]
    fn the_receive_buffer_grows_past_rmem_max_as_root() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = socket2::SockRef::from(&socket).recv_buffer_size().unwrap();
        let asked = 16 << 20;
        let granted = grow_recv_buffer(&socket, asked);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // SO_RCVBUFFORCE ignores net.core.rmem_max (4 MiB or less on common systems).
            assert!(granted >= asked, "root was granted {granted} of {asked}");
        } else {
            assert!(granted >= before, "shrank from {before} to {granted}");
        }
    }

    /// What a reset key makes of a connection ID: its stateless-reset token.
    fn token(keys: &RestartStableKeys, cid: &[u8]) -> Vec<u8> {
        let key = keys.stateless_reset();
        let mut out = vec![0; key.signature_len()];
        key.sign(cid, &mut out);
        out
    }

    #[test]
    fn the_automatic_ack_delay_follows_the_rtt_between_25_ms_and_the_cap() {
        let ms = |n| Duration::from_millis(n);
        let auto = DEFAULT_ACK_FREQUENCY.max_delay;
        assert_eq!(auto, Some(AUTO_ACK_DELAY_CAP));
        // A LAN: the 25 ms every QUIC peer may take anyway (RFC 9000 §18.2),
        // so tail-loss recovery on short paths is what it was.
        assert_eq!(
            requested_ack_delay(auto, Duration::from_micros(320)),
            ms(25)
        );
        assert_eq!(requested_ack_delay(auto, ms(25)), ms(25));
        // A WAN: one RTT, so an ACK can wait for the next message back.
        assert_eq!(requested_ack_delay(auto, ms(150)), ms(150));
        // Capped, so the PTO stays bounded on satellite paths.
        assert_eq!(requested_ack_delay(auto, ms(600)), AUTO_ACK_DELAY_CAP);
        // `--ack-delay peer`: the peer's own, whatever the RTT.
        assert_eq!(requested_ack_delay(None, ms(150)), ms(25));
        // A fixed request is lowered to the RTT, never raised.
        assert_eq!(requested_ack_delay(Some(ms(5)), ms(150)), ms(5));
        assert_eq!(requested_ack_delay(Some(ms(100)), ms(40)), ms(40));
        assert_eq!(requested_ack_delay(Some(ms(100)), ms(1)), ms(25));
    }

    #[test]
    fn the_agents_keepalive_outlasts_ovs_echo_cycle_and_leaves_a_margin() {
        let ms = |n| Duration::from_millis(n);
        assert_eq!(agent_keepalive_for(ms(6000)), ms(5250));
        assert_eq!(agent_keepalive_for(ms(10_000)), ms(8750));
        assert_eq!(agent_keepalive_for(ms(4000)), ms(3250));
        assert_eq!(agent_keepalive_for(ms(1000)), ms(500));
        assert_eq!(QuicOptions::default().keepalive, ms(5250));
        assert_eq!(keepalive_for(ms(6000)), ms(3000));
    }

    #[test]
    fn the_restart_stable_keys_survive_a_restart_and_differ_per_key_and_address() {
        use quinn::ConnectionIdGenerator;
        let dir = tempfile::tempdir().unwrap();
        let ctl = creds(dir.path(), "ctl");
        let other = creds(dir.path(), "ctl2");
        let addr: SocketAddr = "10.254.1.1:6653".parse().unwrap();
        let elsewhere: SocketAddr = "10.254.1.1:6654".parse().unwrap();
        let keys = RestartStableKeys::new(&ctl, addr);
        let cid = [7u8; 8];
        // A restart reloads the same files.
        let (cert, key) = crate::pki::cert_paths(dir.path(), "ctl");
        let ca = crate::pki::ca_paths(dir.path()).0;
        let reloaded = Credentials::load(&TlsFiles { ca, cert, key }).unwrap();
        let restarted = RestartStableKeys::new(&reloaded, addr);
        assert_eq!(token(&restarted, &cid), token(&keys, &cid));
        assert_eq!(restarted.connection_ids(), keys.connection_ids());
        // The restarted agent recognises its predecessor's connection IDs, of
        // every length.
        let issue = |k: &RestartStableKeys, len| {
            let mut g = KeyedConnectionIdGenerator::new(k.connection_ids(), len);
            (0..200).map(|_| g.generate_cid()).collect::<Vec<_>>()
        };
        for len in CID_LENS {
            let check = KeyedConnectionIdGenerator::new(restarted.connection_ids(), len);
            for id in issue(&keys, len) {
                assert_eq!(id.len(), len);
                assert!(check.validate(&id).is_ok());
            }
        }
        let issued = issue(&keys, 5);
        // Another private key, or another address: other keys.
        for k in [
            RestartStableKeys::new(&other, addr),
            RestartStableKeys::new(&ctl, elsewhere),
        ] {
            assert_ne!(token(&k, &cid), token(&keys, &cid));
            assert_ne!(k.connection_ids(), keys.connection_ids());
            // Another key passes 1 in 256 of the 5-byte IDs (a 1-byte check)
            // by chance.
            let check = KeyedConnectionIdGenerator::new(k.connection_ids(), 5);
            let passed = issued
                .iter()
                .filter(|id| check.validate(id).is_ok())
                .count();
            assert!(passed < 20, "{passed} of 200 passed another key's check");
        }
        // Another connection ID: another token.
        assert_ne!(token(&keys, &[8u8; 8]), token(&keys, &cid));
    }

    /// A restarted controller agent issues IDs from the same space as its
    /// predecessor ([`CID_NONCE_LEN`]): they must seldom coincide. 200,000
    /// IDs drawn without quinn's redraw have 200,000² / 2 / 2³² ≈ 4.7 equal
    /// pairs expected with 4 random bytes, ≈ 1,190 with 3. With 4 bytes, 40
    /// or more happens with a probability below 10⁻¹⁵; with 3, fewer than
    /// 40 is as unlikely.
    #[test]
    fn default_connection_ids_seldom_repeat_across_restarts() {
        use quinn::ConnectionIdGenerator;
        let mut g = KeyedConnectionIdGenerator::new(0x5eed, DEFAULT_CID_LEN);
        let mut seen = std::collections::HashSet::new();
        let repeats = (0..200_000)
            .filter(|_| !seen.insert(g.generate_cid()))
            .count();
        assert!(repeats < 40, "{repeats} repeated IDs among 200,000");
        // Every 4-byte ID is one of ours: nothing is left for a check.
        assert!(g.validate(&quinn::ConnectionId::new(&[1, 2, 3, 4])).is_ok());
        assert!(g.validate(&quinn::ConnectionId::new(&[1, 2, 3])).is_err());
    }
}
