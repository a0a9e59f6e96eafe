//! One QUIC connection between a switch agent and a controller agent, seen from
//! either end: the hello exchange, sessions the peer opens (lanes are read,
//! checked and assembled, then the local peer is dialled), and sessions this side
//! opens.

use crate::services::{Service, ServiceTable};
use crate::session::{self, Lane, SessionInfo};
use bytes::{Bytes, BytesMut};
use quicsdn_lanes::StreamMode;
use quicsdn_transport::local::LocalStream;
use quicsdn_wire::preamble::{Hello, LanePreamble, Opener, StreamStart, code};
use quinn::{RecvStream, SendStream, VarInt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info, warn};

/// How long a peer may take to send a stream's preamble, or all lanes of a session.
const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(10);

struct Pending {
    service: Arc<Service>,
    lanes: Vec<Option<Lane>>,
}

/// A live QUIC connection to the peer agent.
pub struct Link {
    pub conn: quinn::Connection,
    /// Identity of the switch this connection serves (our own on the switch agent).
    pub switch: Arc<str>,
    services: Arc<ServiceTable>,
    mode: StreamMode,
    local_connect_timeout: Duration,
    next_session: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
}

impl Link {
    pub fn new(
        conn: quinn::Connection,
        switch: Arc<str>,
        services: Arc<ServiceTable>,
        mode: StreamMode,
        local_connect_timeout: Duration,
    ) -> Arc<Link> {
        Arc::new(Link {
            conn,
            switch,
            services,
            mode,
            local_connect_timeout,
            next_session: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
        })
    }

    fn on_switch(&self) -> bool {
        self.services.role == Opener::Switch
    }

    fn names(&self) -> (&'static str, &'static str) {
        if self.on_switch() {
            ("OVS", "controller agent")
        } else {
            ("controller", "switch agent")
        }
    }

    fn info(&self, service: &Arc<Service>, id: u64) -> SessionInfo {
        let (local_name, remote_name) = self.names();
        SessionInfo {
            switch: self.switch.clone(),
            service: service.clone(),
            id,
            local_name,
            remote_name,
        }
    }

    /// True while the connection is usable.
    pub fn is_alive(&self) -> bool {
        self.conn.close_reason().is_none()
    }

    /// Serves streams the peer opens until the connection closes, and returns why
    /// it closed.
    pub async fn serve(self: Arc<Self>) -> quinn::ConnectionError {
        loop {
            match self.conn.accept_bi().await {
                Ok((send, recv)) => {
                    tokio::spawn(self.clone().incoming(send, recv));
                }
                Err(e) => return e,
            }
        }
    }

    /// Opens a session for a local connection this agent accepted.
    pub async fn open_session(self: Arc<Self>, service: Arc<Service>, local: LocalStream) {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let lanes = self.mode.lanes_for(service.framing);
        let mut opened = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let preamble = LanePreamble {
                session: id,
                lane: lane as u64,
                lanes: lanes as u64,
                service: service.name.clone(),
            }
            .encode();
            let result = async {
                let (mut send, recv) = self.conn.open_bi().await?;
                send.write_all(&preamble).await?;
                Ok::<_, quinn::WriteError>((send, recv))
            }
            .await;
            match result {
                Ok((send, recv)) => opened.push(Lane {
                    send,
                    recv,
                    initial: Bytes::new(),
                }),
                Err(e) => {
                    info!(
                        switch = %self.switch, service = %service.name, session = id,
                        "{} connection closed: cannot open a session: {e}", self.names().0
                    );
                    session::refuse(opened, code::LOCAL_ABORT);
                    return;
                }
            }
        }
        session::run(self.info(&service, id), local, opened).await;
    }

    /// The switch agent's side of the hello exchange: sends ours, waits for the
    /// controller agent's, and logs any service mismatch.
    ///
    /// The answer also proves the controller agent accepted our certificate: in TLS
    /// 1.3 the client finishes its handshake before the server has verified the
    /// client's certificate (RFC 8446 §4.4.2–§4.4.4), and a server that rejects it
    /// only closes the connection afterwards. A connection only counts as up once
    /// the peer has spoken on it.
    pub async fn hello_as_client(&self) -> Result<Hello, String> {
        let hello = self.services.hello(self.mode);
        let exchange = async {
            let (mut send, mut recv) = self.conn.open_bi().await.map_err(|e| e.to_string())?;
            send.write_all(&hello.encode())
                .await
                .map_err(|e| e.to_string())?;
            let _ = send.finish();
            match read_start(&mut recv).await? {
                (StreamStart::Control(theirs), _) => Ok(theirs),
                (StreamStart::Lane(_), _) => {
                    Err("the peer answered the hello with a lane preamble".to_string())
                }
            }
        };
        let result = exchange.await.map_err(|e| match self.conn.close_reason() {
            // The connection's own close reason says more than the stream error.
            Some(reason) => reason.to_string(),
            None => e,
        });
        if let Ok(theirs) = &result {
            self.check_hello(theirs);
        }
        result
    }

    fn check_hello(&self, theirs: &Hello) {
        let (_, remote) = self.names();
        info!(
            switch = %self.switch,
            peer_agent = %theirs.agent,
            peer_streams = %theirs.streams,
            "{remote} serves: {}",
            theirs.services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
        );
        for problem in self.services.compare(theirs) {
            warn!(switch = %self.switch, "{problem}");
        }
    }

    async fn incoming(self: Arc<Self>, mut send: SendStream, mut recv: RecvStream) {
        let (start, initial) = match read_start(&mut recv).await {
            Ok(x) => x,
            Err(e) => {
                warn!(switch = %self.switch, "refused a stream from the {}: {e}", self.names().1);
                let _ = send.reset(VarInt::from_u32(code::BAD_PREAMBLE));
                let _ = recv.stop(VarInt::from_u32(code::BAD_PREAMBLE));
                return;
            }
        };
        match start {
            StreamStart::Control(theirs) => {
                if !self.on_switch() {
                    let _ = send
                        .write_all(&self.services.hello(self.mode).encode())
                        .await;
                    let _ = send.finish();
                }
                self.check_hello(&theirs);
            }
            StreamStart::Lane(p) => {
                let lane = Lane {
                    send,
                    recv,
                    initial,
                };
                self.incoming_lane(p, lane);
            }
        }
    }

    fn incoming_lane(self: &Arc<Self>, p: LanePreamble, lane: Lane) {
        let (_, remote) = self.names();
        let refuse = |lane: Lane, c: u32, why: String| {
            warn!(switch = %self.switch, service = %p.service, session = p.session, "refused a session from the {remote}: {why}");
            session::refuse(vec![lane], c);
        };
        let Some(service) = self.services.get(&p.service).cloned() else {
            return refuse(
                lane,
                code::UNKNOWN_SERVICE,
                format!(
                    "unknown service (this agent serves: {})",
                    self.services.names()
                ),
            );
        };
        if service.opener == self.services.role {
            return refuse(
                lane,
                code::WRONG_DIRECTION,
                "sessions of this service are opened by this side (its target here is a listening one)".into(),
            );
        }
        if p.lanes > 1 && !service.framing.has_boundaries() {
            return refuse(
                lane,
                code::BAD_PREAMBLE,
                "a raw service cannot use several lanes".into(),
            );
        }
        let complete = {
            let mut pending = self.pending.lock().expect("pending map lock");
            let first = !pending.contains_key(&p.session);
            let entry = pending.entry(p.session).or_insert_with(|| Pending {
                service: service.clone(),
                lanes: (0..p.lanes).map(|_| None).collect(),
            });
            let slot = (entry.lanes.len() == p.lanes as usize
                && entry.service.name == service.name)
                .then(|| entry.lanes.get_mut(p.lane as usize))
                .flatten()
                .filter(|slot| slot.is_none());
            let Some(slot) = slot else {
                drop(pending);
                return refuse(
                    lane,
                    code::BAD_PREAMBLE,
                    "lane does not fit its session".into(),
                );
            };
            *slot = Some(lane);
            if first && p.lanes > 1 {
                tokio::spawn(self.clone().expire_pending(p.session));
            }
            if entry.lanes.iter().all(Option::is_some) {
                pending.remove(&p.session)
            } else {
                None
            }
        };
        if let Some(done) = complete {
            let lanes = done.lanes.into_iter().flatten().collect();
            tokio::spawn(self.clone().accept_session(p.session, done.service, lanes));
        }
    }

    async fn expire_pending(self: Arc<Self>, session: u64) {
        tokio::time::sleep(PREAMBLE_TIMEOUT).await;
        let stale = self
            .pending
            .lock()
            .expect("pending map lock")
            .remove(&session);
        if let Some(p) = stale {
            warn!(
                switch = %self.switch, service = %p.service.name, session,
                "refused a session from the {}: not all of its lanes arrived within {PREAMBLE_TIMEOUT:?}",
                self.names().1
            );
            session::refuse(p.lanes.into_iter().flatten().collect(), code::BAD_PREAMBLE);
        }
    }

    async fn accept_session(self: Arc<Self>, id: u64, service: Arc<Service>, lanes: Vec<Lane>) {
        let target = service.target.for_switch(&self.switch);
        let (local_name, _) = self.names();
        let failure = match tokio::time::timeout(
            self.local_connect_timeout,
            LocalStream::connect(&target),
        )
        .await
        {
            Ok(Ok(local)) => {
                debug!(switch = %self.switch, service = %service.name, session = id, %target, "connected locally");
                return session::run(self.info(&service, id), local, lanes).await;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.local_connect_timeout),
        };
        warn!(
            switch = %self.switch, service = %service.name, session = id,
            "cannot reach the {local_name} at {target}: {failure}; refusing the session"
        );
        session::refuse(lanes, code::LOCAL_CONNECT_FAILED);
    }
}

/// Reads a stream's preamble, returning it and whatever bytes followed it.
async fn read_start(recv: &mut RecvStream) -> Result<(StreamStart, Bytes), String> {
    let mut buf = BytesMut::new();
    let read = async {
        loop {
            if let Some((start, n)) = StreamStart::decode(&buf).map_err(|e| e.to_string())? {
                let _ = buf.split_to(n);
                return Ok((start, buf.freeze()));
            }
            match recv.read_chunk(usize::MAX, true).await {
                Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
                Ok(None) => return Err("stream ended before its preamble".to_string()),
                Err(e) => return Err(format!("stream failed before its preamble: {e}")),
            }
        }
    };
    tokio::time::timeout(PREAMBLE_TIMEOUT, read)
        .await
        .map_err(|_| format!("no preamble within {PREAMBLE_TIMEOUT:?}"))?
}
