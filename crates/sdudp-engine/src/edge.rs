//! The TCP engine of an edge switch: the hosts' TCP is terminated by this
//! namespace's kernel, transparently, and [`Edge`] carries the bytes.
//!
//! Kernel plumbing this process expects in its namespace (`edge_netns_setup`
//! in the tests and the lab does it):
//! * `ip rule iif PORT ipproto tcp lookup BLACKHOLE` (table with a blackhole
//!   default route): a host's TCP reaches no socket until this engine lets it;
//! * `ip rule iif INJECT_PEER lookup LOCAL` (table with `local default dev
//!   lo`), and `rp_filter` off: a SYN this engine re-injects through the veth
//!   pair INJECT ↔ INJECT_PEER is delivered locally;
//! * per connection, once the far host accepted, this engine adds
//!   `ip rule iif PORT from HOST ipproto tcp sport P dport Q lookup LOCAL`.
//!
//! Listeners and connecting sockets use `IP_TRANSPARENT`, so they own the
//! hosts' addresses: host 1 talks to "host 2" and host 2 to "host 1".

use crate::frame::{self, Incoming, Mac, Ports};
use crate::packet::{FrameIo, PacketSocket};
use crate::relay::Neighbour;
use crate::tcp::{self, Syn};
use anyhow::{Context, Result, bail};
use quicsdn_sdudp::conn::{ConnEvent, ConnId, Edge, EdgeConfig, Output};
use quicsdn_sdudp::msg::RefuseReason;
use quicsdn_sdudp::{FlowKey, TcpOptions};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::process::Command;
use std::time::{Duration, Instant};

/// Settings of an edge engine process.
#[derive(Debug, Clone)]
pub struct EdgeSpec {
    pub port: String,
    pub inject: String,
    pub inject_peer_mac: Mac,
    pub me: Neighbour,
    pub neighbour: Neighbour,
    /// Which far edge engine serves which host addresses.
    pub far_edges: Vec<(Ipv4Addr, u8, Ipv4Addr)>,
    pub ports: Ports,
    pub local_table: u32,
    pub connect_timeout: Duration,
    pub cfg: EdgeConfig,
}

enum Sock {
    /// Ingress: SYN held until the far host accepts.
    Held(Syn),
    /// Ingress: accepted; waiting for the kernel's handshake to finish.
    Accepting(Syn),
    /// Egress: connecting to the host since.
    Connecting(TcpStream, Instant),
    Open(TcpStream),
    Gone,
}

struct HostConn {
    sock: Sock,
    /// The policy rule that lets this connection's packets in.
    rule: Option<String>,
    read_closed: bool,
}

pub struct EdgeEngine {
    spec: EdgeSpec,
    port: PacketSocket,
    inject: PacketSocket,
    edge: Edge,
    conns: HashMap<ConnId, HostConn>,
    /// Ingress connections by (client, server), for retransmitted SYNs and accept().
    by_pair: HashMap<(SocketAddrV4, SocketAddrV4), ConnId>,
    listeners: HashMap<u16, TcpListener>,
    next_port: u16,
    pub resets_sent: u64,
}

fn ip(args: &[String]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn set_transparent(fd: RawFd) -> Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket and an int option.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_IP,
            libc::IP_TRANSPARENT,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error())
            .context("IP_TRANSPARENT (needs CAP_NET_ADMIN)");
    }
    Ok(())
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn tcp_socket() -> Result<RawFd> {
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("TCP socket");
    }
    Ok(fd)
}

fn bind(fd: RawFd, a: SocketAddrV4) -> Result<()> {
    let one: libc::c_int = 1;
    let sa = sockaddr(a);
    // SAFETY: valid socket, option and address.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const libc::c_int as *const libc::c_void,
            4,
        );
        if libc::bind(
            fd,
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        ) < 0
        {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("bind {a}"));
        }
    }
    Ok(())
}

/// A listener owning `port` on every address (with the policy rules, only
/// connections this engine let in reach it).
fn transparent_listener(port: u16) -> Result<TcpListener> {
    let fd = tcp_socket()?;
    // SAFETY: we own `fd`; TcpListener closes it.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    set_transparent(fd)?;
    bind(fd, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
    // SAFETY: valid socket.
    if unsafe { libc::listen(fd, 1024) } < 0 {
        return Err(std::io::Error::last_os_error()).context("listen");
    }
    Ok(l)
}

/// Connects to `server` from `client`'s address and port (non-blocking).
fn transparent_connect(client: SocketAddrV4, server: SocketAddrV4) -> Result<TcpStream> {
    let fd = tcp_socket()?;
    // SAFETY: we own `fd`; TcpStream closes it.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    set_transparent(fd)?;
    bind(fd, client)?;
    let sa = sockaddr(server);
    // SAFETY: valid socket and address.
    let rc = unsafe {
        libc::connect(
            fd,
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e).with_context(|| format!("connect {client} -> {server}"));
        }
    }
    Ok(s)
}

/// Closes with RST (SO_LINGER 0).
fn reset(s: TcpStream) {
    set_linger_zero(&s, true);
}

/// With SO_LINGER {1, 0} any close of the socket, also this process dying,
/// resets the host's connection instead of closing it cleanly: a host never
/// mistakes an engine's death for the end of the stream.
fn set_linger_zero(s: &TcpStream, on: bool) {
    let l = libc::linger {
        l_onoff: on as libc::c_int,
        l_linger: 0,
    };
    // SAFETY: valid socket and option.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as u32,
        );
    }
}

fn socket_error(s: &TcpStream) -> Option<std::io::Error> {
    s.take_error().ok().flatten()
}

/// Prepares the engine's namespace (idempotent): the injection veth pair,
/// the local and blackhole tables and their rules, rp_filter off, and no
/// offloads on the switch port (the switch is a userspace datapath).
pub fn setup_namespace(spec: &EdgeSpec, inject_peer: &str) -> Result<()> {
    let sh = |args: &str| ip(&args.split(' ').map(String::from).collect::<Vec<_>>());
    if !std::path::Path::new(&format!("/sys/class/net/{}", spec.inject)).exists() {
        sh(&format!(
            "link add {} type veth peer name {inject_peer}",
            spec.inject
        ))?;
    }
    sh(&format!("link set {} up", spec.inject))?;
    sh(&format!(
        "link set {inject_peer} address {} up",
        spec.inject_peer_mac
    ))?;
    let local = spec.local_table;
    let blackhole = local + 1;
    sh(&format!("route replace local default dev lo table {local}"))?;
    sh(&format!(
        "route replace blackhole default table {blackhole}"
    ))?;
    let (lo, hi) = (
        spec.ports.control.min(*spec.ports.data.start()),
        *spec.ports.data.end(),
    );
    for rule in [
        format!("iif {inject_peer} lookup {local} priority 100"),
        format!(
            "iif {} ipproto tcp lookup {blackhole} priority 32000",
            spec.port
        ),
        // SDUDP datagrams are this process's, not the kernel's: without this
        // the kernel would answer each with ICMP port unreachable.
        format!(
            "iif {} ipproto udp dport {lo}-{hi} lookup {blackhole} priority 32001",
            spec.port
        ),
    ] {
        let _ = sh(&format!("rule del {rule}"));
        sh(&format!("rule add {rule}"))?;
    }
    for dev in ["all", "default", inject_peer, spec.port.as_str()] {
        let path = format!("/proc/sys/net/ipv4/conf/{dev}/rp_filter");
        std::fs::write(&path, "0").with_context(|| format!("writing {path}"))?;
    }
    let out = Command::new("ethtool")
        .args([
            "-K", &spec.port, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
        ])
        .output()
        .context("running ethtool")?;
    if !out.status.success() {
        bail!(
            "ethtool -K {}: {}",
            spec.port,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl EdgeEngine {
    pub fn new(spec: EdgeSpec) -> Result<EdgeEngine> {
        let port = PacketSocket::open(&spec.port)?;
        let inject = PacketSocket::open(&spec.inject)?;
        let edge = Edge::new(spec.cfg.clone());
        let next_port = *spec.ports.data.start() + 1;
        Ok(EdgeEngine {
            spec,
            port,
            inject,
            edge,
            conns: HashMap::new(),
            by_pair: HashMap::new(),
            listeners: HashMap::new(),
            next_port,
            resets_sent: 0,
        })
    }

    pub fn edge(&self) -> &Edge {
        &self.edge
    }

    fn far_edge(&self, host: Ipv4Addr) -> Option<Ipv4Addr> {
        self.spec
            .far_edges
            .iter()
            .find(|(net, len, _)| {
                let mask = if *len == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(*len))
                };
                u32::from(host) & mask == u32::from(*net) & mask
            })
            .map(|(_, _, e)| *e)
    }

    fn allocate_port(&mut self) -> u16 {
        // The range's first port is every initiator's peer port, so the
        // flows of connections opened from either side never collide.
        let (lo, hi) = (
            *self.spec.ports.data.start() + 1,
            *self.spec.ports.data.end(),
        );
        let p = self.next_port;
        self.next_port = if p >= hi { lo } else { p + 1 };
        p
    }

    fn handle_frame(&mut self, now: Instant, f: &[u8]) {
        if let Some(syn) = tcp::parse_syn(f) {
            if self.by_pair.contains_key(&(syn.client, syn.server)) {
                return; // a retransmitted SYN: still held, or the kernel has it
            }
            let Some(far) = self.far_edge(*syn.server.ip()) else {
                return;
            };
            let p = self.allocate_port();
            let flow = FlowKey {
                src: self.spec.me.ip,
                dst: far,
                sport: p,
                dport: *self.spec.ports.data.start(),
            };
            let id = self.edge.open(
                now,
                flow,
                syn.client,
                syn.server,
                syn.client_mac.0,
                syn.options,
            );
            self.by_pair.insert((syn.client, syn.server), id);
            self.conns.insert(
                id,
                HostConn {
                    sock: Sock::Held(syn),
                    rule: None,
                    read_closed: false,
                },
            );
            return;
        }
        match frame::classify(f, self.spec.me.ip, &self.spec.ports).1 {
            Incoming::Data { flow, id, payload } => self.edge.handle_data(now, flow, id, payload),
            Incoming::Control(c) => self.edge.handle_control(now, c),
            _ => {}
        }
    }

    fn add_rule(&self, from: SocketAddrV4, to_port: u16) -> Result<String> {
        let sel = format!(
            "iif {} from {}/32 ipproto tcp sport {} dport {} lookup {}",
            self.spec.port,
            from.ip(),
            from.port(),
            to_port,
            self.spec.local_table
        );
        let mut args: Vec<String> = vec!["rule".into(), "add".into()];
        args.extend(sel.split(' ').map(String::from));
        ip(&args)?;
        Ok(sel)
    }

    fn drop_rule(rule: &Option<String>) {
        if let Some(sel) = rule {
            let mut args: Vec<String> = vec!["rule".into(), "del".into()];
            args.extend(sel.split(' ').map(String::from));
            if let Err(e) = ip(&args) {
                tracing::warn!("removing a connection's rule: {e:#}");
            }
        }
    }

    fn handle_events(&mut self, now: Instant) -> Result<()> {
        while let Some((id, e)) = self.edge.poll_event() {
            match e {
                ConnEvent::AcceptHost { .. } => {
                    let Some(c) = self.conns.get_mut(&id) else {
                        continue;
                    };
                    let Sock::Held(syn) = std::mem::replace(&mut c.sock, Sock::Gone) else {
                        continue;
                    };
                    let port = syn.server.port();
                    if let std::collections::hash_map::Entry::Vacant(v) = self.listeners.entry(port)
                    {
                        v.insert(transparent_listener(port)?);
                    }
                    let rule = self.add_rule(syn.client, port)?;
                    let c = self.conns.get_mut(&id).expect("present");
                    c.rule = Some(rule);
                    c.sock = Sock::Accepting(syn.clone());
                    // Let the kernel see the host's SYN now: it answers SYN-ACK.
                    self.inject
                        .send(&syn.frame_with_dst(self.spec.inject_peer_mac))?;
                }
                ConnEvent::RefuseHost(reason) => {
                    if let Some(c) = self.conns.get_mut(&id)
                        && let Sock::Held(syn) = &c.sock
                        && reason == RefuseReason::Refused
                    {
                        let f = tcp::refuse(syn, self.spec.me.mac);
                        self.port.send(&f)?;
                        self.resets_sent += 1;
                    }
                }
                ConnEvent::ConnectHost { client, server, .. } => {
                    let rule = self.add_rule(server, client.port())?;
                    let sock = match transparent_connect(client, server) {
                        Ok(s) => Sock::Connecting(s, now),
                        Err(e) => {
                            tracing::warn!("connecting {client} -> {server}: {e:#}");
                            self.edge.host_refused(now, id, RefuseReason::Unreachable);
                            Sock::Gone
                        }
                    };
                    self.conns.insert(
                        id,
                        HostConn {
                            sock,
                            rule: Some(rule),
                            read_closed: false,
                        },
                    );
                }
                ConnEvent::HostReadable => {}
                ConnEvent::ShutdownHost => {
                    if let Some(HostConn {
                        sock: Sock::Open(s),
                        ..
                    }) = self.conns.get(&id)
                    {
                        let _ = s.shutdown(std::net::Shutdown::Write);
                    }
                }
                ConnEvent::ResetHost { failure } => {
                    if let Some(c) = self.conns.get_mut(&id) {
                        tracing::info!(?failure, "resetting a host connection");
                        if let Sock::Open(s) | Sock::Connecting(s, _) =
                            std::mem::replace(&mut c.sock, Sock::Gone)
                        {
                            reset(s);
                        }
                    }
                }
                ConnEvent::Closed => {
                    if let Some(c) = self.conns.remove(&id) {
                        if let Sock::Open(s) = &c.sock {
                            // Both sides closed cleanly: no RST.
                            set_linger_zero(s, false);
                        }
                        Self::drop_rule(&c.rule);
                        if let Sock::Accepting(syn) | Sock::Held(syn) = &c.sock {
                            self.by_pair.remove(&(syn.client, syn.server));
                        }
                    }
                    self.by_pair.retain(|_, v| *v != id);
                }
            }
        }
        Ok(())
    }

    fn accept_all(&mut self) {
        for l in self.listeners.values() {
            while let Ok((s, peer)) = l.accept() {
                let (SocketAddr::V4(peer), Ok(SocketAddr::V4(local))) = (peer, s.local_addr())
                else {
                    continue;
                };
                match self.by_pair.get(&(peer, local)) {
                    Some(id) => {
                        let _ = s.set_nonblocking(true);
                        let _ = s.set_nodelay(true);
                        set_linger_zero(&s, true);
                        if let Some(c) = self.conns.get_mut(id) {
                            c.sock = Sock::Open(s);
                        }
                    }
                    None => reset(s),
                }
            }
        }
    }

    /// Moves bytes between the sockets and the edge; completes connects.
    fn pump_sockets(&mut self, now: Instant) {
        let mut buf = vec![0u8; 65_536];
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            match &mut c.sock {
                Sock::Connecting(s, since) => {
                    if let Some(e) = socket_error(s) {
                        let reason = if e.kind() == ErrorKind::ConnectionRefused {
                            RefuseReason::Refused
                        } else {
                            RefuseReason::Unreachable
                        };
                        c.sock = Sock::Gone;
                        self.edge.host_refused(now, id, reason);
                    } else if s.peer_addr().is_ok() {
                        let _ = s.set_nodelay(true);
                        set_linger_zero(s, true);
                        let Sock::Connecting(s, _) = std::mem::replace(&mut c.sock, Sock::Gone)
                        else {
                            unreachable!()
                        };
                        c.sock = Sock::Open(s);
                        self.edge
                            .host_connected(now, id, [0; 6], TcpOptions::default());
                    } else if now.duration_since(*since) > self.spec.connect_timeout {
                        c.sock = Sock::Gone;
                        self.edge.host_refused(now, id, RefuseReason::Unreachable);
                    }
                }
                Sock::Open(s) => {
                    // To the host, as much as it takes.
                    while let Some(d) = self.edge.peek_for_host(id) {
                        match s.write(d) {
                            Ok(0) => break,
                            Ok(n) => self.edge.consume_for_host(now, id, n),
                            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                            Err(_) => {
                                self.edge.host_reset(now, id);
                                break;
                            }
                        }
                    }
                    // From the host, only as much as the path can hold: a
                    // full path stops reading, and TCP slows the host.
                    while !c.read_closed {
                        let cap = self.edge.send_capacity(id).min(buf.len());
                        if cap == 0 {
                            break;
                        }
                        match s.read(&mut buf[..cap]) {
                            Ok(0) => {
                                c.read_closed = true;
                                self.edge.host_fin(now, id);
                            }
                            Ok(n) => {
                                self.edge.send(now, id, &buf[..n]);
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                            Err(_) => {
                                c.read_closed = true;
                                self.edge.host_reset(now, id);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn flush(&mut self) -> Result<()> {
        while let Some(o) = self.edge.poll_output() {
            let n = self.spec.neighbour;
            let f = match o {
                Output::Data { flow, id, payload } => {
                    frame::data_frame(n.mac, self.spec.me.mac, flow, id, &payload)
                }
                Output::Control(c) => frame::control_frame(
                    (n.mac, n.ip),
                    (self.spec.me.mac, self.spec.me.ip),
                    self.spec.ports.control,
                    &c,
                ),
            };
            self.port.send(&f)?;
        }
        Ok(())
    }

    /// One round of the loop (waits at most `max_wait`).
    pub fn step(&mut self, max_wait: Duration) -> Result<()> {
        let now = Instant::now();
        let mut wait = self
            .edge
            .poll_timeout()
            .map_or(max_wait, |t| t.saturating_duration_since(now).min(max_wait));
        // Wake for frames, new connections, and sockets that can move bytes
        // (read only while the path has room: that is the backpressure).
        let mut fds = vec![libc::pollfd {
            fd: self.port.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        for l in self.listeners.values() {
            fds.push(libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        for (id, c) in &self.conns {
            let (fd, mut events) = match &c.sock {
                Sock::Connecting(s, since) => {
                    // The connect timeout is checked in the rounds.
                    let left = self
                        .spec
                        .connect_timeout
                        .saturating_sub(now.saturating_duration_since(*since));
                    wait = wait.min(left + Duration::from_millis(1));
                    (s.as_raw_fd(), libc::POLLOUT)
                }
                Sock::Open(s) => (s.as_raw_fd(), 0),
                _ => continue,
            };
            if matches!(c.sock, Sock::Open(_)) {
                if !c.read_closed && self.edge.send_capacity(*id) > 0 {
                    events |= libc::POLLIN;
                }
                if self.edge.peek_for_host(*id).is_some() {
                    events |= libc::POLLOUT;
                }
            }
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: a valid array of pollfds.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e).context("poll");
            }
        }
        let mut buf = vec![0u8; 65_536];
        let now = Instant::now();
        for _ in 0..256 {
            match self.port.recv(&mut buf)? {
                Some(n) => {
                    let f = buf[..n].to_vec();
                    self.handle_frame(now, &f);
                }
                None => break,
            }
        }
        self.accept_all();
        self.pump_sockets(now);
        self.edge.handle_timeout(now);
        self.handle_events(now)?;
        self.pump_sockets(now);
        self.handle_events(now)?;
        self.flush()
    }
}
