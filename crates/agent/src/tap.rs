//! Copies of the messages one switch's service carries, for `quicsdn snoop`
//! (the role of Open vSwitch's snoop socket).
//!
//! Contract:
//! * **Free when unused.** A session checks one atomic counter per run of
//!   messages; only when a snoop client is attached does it split the run
//!   into messages and copy them.
//! * **Bounded.** Each client has a queue of at most [`QUEUE_MESSAGES`]
//!   messages and [`QUEUE_BYTES`] bytes. What does not fit is dropped and
//!   counted; the client is told "N messages dropped" with the next messages.
//!   A slow client never holds a session back and never grows the agent.
//! * **Ends cleanly.** A [`Subscription`] unregisters when dropped (the client
//!   went away); one that is not `follow`ing ends after the session it
//!   watches closes.

use bytes::Bytes;
use quicsdn_lanes::marker;
use quicsdn_lanes::rules::Direction;
use quicsdn_wire::openflow::{HEADER_LEN, Header};
use quicsdn_wire::{Framer, Framing};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Messages a client's queue holds at most.
pub const QUEUE_MESSAGES: usize = 4096;
/// Bytes of messages a client's queue holds at most.
pub const QUEUE_BYTES: usize = 4 << 20;

/// What a snoop client receives, one JSON line each.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "ev", rename_all = "lowercase")]
pub enum Event {
    /// A session of the watched switch and service opened.
    Open { session: u64, t_us: u64 },
    /// One message. `dir` is the way it travels (`to_switch`,
    /// `to_controller`); `lane` the session's lane it rode and `stream` that
    /// lane's QUIC stream id; `data` the message, base64.
    Msg {
        session: u64,
        t_us: u64,
        dir: &'static str,
        lane: usize,
        stream: Option<u64>,
        #[serde(serialize_with = "base64_bytes")]
        data: Bytes,
    },
    /// The session closed.
    Close { session: u64, t_us: u64 },
    /// Messages dropped because the client did not keep up.
    Dropped { messages: u64 },
}

fn base64_bytes<S: serde::Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
    use base64::Engine;
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
}

impl Event {
    fn session(&self) -> Option<u64> {
        match self {
            Event::Open { session, .. }
            | Event::Msg { session, .. }
            | Event::Close { session, .. } => Some(*session),
            Event::Dropped { .. } => None,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Event::Msg { data, .. } => data.len(),
            _ => 0,
        }
    }
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[derive(Default)]
struct Queue {
    events: VecDeque<Event>,
    bytes: usize,
    dropped: u64,
    /// The session watched (not following): the first one seen.
    session: Option<u64>,
    /// The watched session closed (not following).
    ended: bool,
}

/// One attached snoop client.
struct Client {
    switch: Arc<str>,
    service: String,
    follow: bool,
    queue: Mutex<Queue>,
    notify: Notify,
}

impl Client {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn offer(&self, event: Event) {
        let mut q = self.queue();
        if q.ended {
            return;
        }
        if !self.follow {
            match (q.session, event.session()) {
                (None, Some(s)) => q.session = Some(s),
                (Some(w), Some(s)) if w != s => return,
                _ => {}
            }
        }
        let n = event.bytes();
        // The end of the watched session always gets through (once).
        let last = !self.follow && matches!(event, Event::Close { .. });
        if !last && (q.events.len() >= QUEUE_MESSAGES || q.bytes + n > QUEUE_BYTES) {
            q.dropped += 1;
        } else {
            q.ended = last;
            q.bytes += n;
            q.events.push_back(event);
        }
        drop(q);
        self.notify.notify_one();
    }
}

/// The agent's attached snoop clients.
#[derive(Default)]
pub struct Taps {
    attached: AtomicUsize,
    clients: Mutex<Vec<Arc<Client>>>,
}

impl std::fmt::Debug for Taps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Taps({} attached)",
            self.attached.load(Ordering::Relaxed)
        )
    }
}

impl Taps {
    pub fn new() -> Arc<Taps> {
        Arc::default()
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Client>>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Snoop clients attached now.
    pub fn attached(&self) -> usize {
        self.attached.load(Ordering::Relaxed)
    }

    /// Attaches a client to `switch`'s `service`: the next session that shows
    /// a message (or, with `follow`, every session) until dropped.
    pub fn subscribe(self: &Arc<Self>, switch: &str, service: &str, follow: bool) -> Subscription {
        let client = Arc::new(Client {
            switch: switch.into(),
            service: service.into(),
            follow,
            queue: Mutex::default(),
            notify: Notify::new(),
        });
        self.clients().push(client.clone());
        self.attached.fetch_add(1, Ordering::Relaxed);
        Subscription {
            taps: self.clone(),
            client,
        }
    }

    /// The clients watching `switch`'s `service`.
    fn watching(&self, switch: &str, service: &str) -> Vec<Arc<Client>> {
        self.clients()
            .iter()
            .filter(|c| &*c.switch == switch && c.service == service)
            .cloned()
            .collect()
    }

    fn publish(&self, switch: &str, service: &str, event: impl Fn() -> Event) {
        for c in self.watching(switch, service) {
            c.offer(event());
        }
    }
}

/// An attached client; detaches when dropped.
pub struct Subscription {
    taps: Arc<Taps>,
    client: Arc<Client>,
}

impl Subscription {
    /// Waits until there is something to take.
    pub async fn ready(&self) {
        self.client.notify.notified().await
    }

    /// Takes what is queued: a `Dropped` event first if messages were dropped
    /// since the last take; and whether the watched session has ended.
    pub fn take(&self) -> (Vec<Event>, bool) {
        let mut q = self.client.queue();
        let mut out = Vec::with_capacity(q.events.len() + 1);
        if q.dropped > 0 {
            out.push(Event::Dropped {
                messages: std::mem::take(&mut q.dropped),
            });
        }
        out.extend(q.events.drain(..));
        q.bytes = 0;
        (out, q.ended)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.taps
            .clients()
            .retain(|c| !Arc::ptr_eq(c, &self.client));
        self.taps.attached.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One session's side of the taps.
#[derive(Clone)]
pub struct SessionTap {
    taps: Arc<Taps>,
    switch: Arc<str>,
    service: String,
    session: u64,
    framing: Framing,
}

fn dir_name(d: Direction) -> &'static str {
    match d {
        Direction::ToSwitch => "to_switch",
        Direction::ToController => "to_controller",
    }
}

impl SessionTap {
    pub fn new(
        taps: Arc<Taps>,
        switch: Arc<str>,
        service: &str,
        session: u64,
        framing: Framing,
    ) -> SessionTap {
        SessionTap {
            taps,
            switch,
            service: service.into(),
            session,
            framing,
        }
    }

    fn active(&self) -> bool {
        self.taps.attached.load(Ordering::Relaxed) > 0
    }

    pub fn opened(&self) {
        if self.active() {
            let t_us = now_us();
            let session = self.session;
            self.taps
                .publish(&self.switch, &self.service, || Event::Open {
                    session,
                    t_us,
                });
        }
    }

    pub fn closed(&self) {
        if self.active() {
            let t_us = now_us();
            let session = self.session;
            self.taps
                .publish(&self.switch, &self.service, || Event::Close {
                    session,
                    t_us,
                });
        }
    }

    /// A run of whole messages that rode `lane` (QUIC `stream`) towards
    /// `dir`. `safe` mode's markers are not messages and are left out.
    pub fn run(&self, dir: Direction, lane: usize, stream: Option<u64>, run: &[u8]) {
        if !self.active() {
            return;
        }
        // Other switches' clients cost this session one lock, no copy.
        let clients = self.taps.watching(&self.switch, &self.service);
        if clients.is_empty() {
            return;
        }
        let t_us = now_us();
        let mut at = 0;
        let mut framer = Framer::new(self.framing, usize::MAX);
        while at < run.len() {
            let len = match self.framing {
                Framing::OpenFlow => Header::parse(&run[at..])
                    .map_or(run.len() - at, |h| usize::from(h.length).max(HEADER_LEN)),
                Framing::JsonRpc => match framer.next_message(&run[at..]) {
                    Ok(Some(n)) => n,
                    _ => run.len() - at,
                },
                Framing::Raw => run.len() - at,
            }
            .min(run.len() - at);
            let msg = &run[at..at + len];
            at += len;
            if self.framing == Framing::OpenFlow && marker::is_marker(msg) {
                continue;
            }
            let data = Bytes::copy_from_slice(msg);
            for c in &clients {
                c.offer(Event::Msg {
                    session: self.session,
                    t_us,
                    dir: dir_name(dir),
                    lane,
                    stream,
                    data: data.clone(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quicsdn_wire::openflow::build;

    fn tap(taps: &Arc<Taps>, session: u64) -> SessionTap {
        SessionTap::new(
            taps.clone(),
            "sw1".into(),
            "openflow",
            session,
            Framing::OpenFlow,
        )
    }

    #[test]
    fn splits_runs_skips_markers_and_filters_by_switch_and_service() {
        let taps = Taps::new();
        let sub = taps.subscribe("sw1", "openflow", false);
        let other = taps.subscribe("sw2", "openflow", false);
        let mut run = build::hello(1);
        run.extend_from_slice(&marker::encode(&[(0, 8)]));
        run.extend_from_slice(&build::barrier_request(2));
        tap(&taps, 1).run(Direction::ToSwitch, 2, Some(6), &run);
        let (events, ended) = sub.take();
        assert!(!ended);
        assert_eq!(events.len(), 2, "{events:?}");
        let Event::Msg {
            data,
            lane,
            stream,
            dir,
            ..
        } = &events[1]
        else {
            panic!("{events:?}")
        };
        assert_eq!(
            (&data[..], *lane, *stream, *dir),
            (&build::barrier_request(2)[..], 2, Some(6), "to_switch")
        );
        assert!(other.take().0.is_empty());
        let line = serde_json::to_value(&events[0]).unwrap();
        assert_eq!(line["ev"], "msg");
        assert_eq!(line["data"], "BAAACAAAAAE=");
    }

    #[test]
    fn costs_nothing_without_clients_and_detaches_on_drop() {
        let taps = Taps::new();
        let sub = taps.subscribe("sw1", "openflow", true);
        assert_eq!(taps.attached(), 1);
        drop(sub);
        assert_eq!(taps.attached(), 0);
        assert!(taps.clients().is_empty());
        // Nothing is queued anywhere when no one listens.
        tap(&taps, 1).run(Direction::ToSwitch, 0, None, &build::hello(1));
    }

    #[test]
    fn bounded_with_a_dropped_count() {
        let taps = Taps::new();
        let sub = taps.subscribe("sw1", "openflow", true);
        let t = tap(&taps, 1);
        for i in 0..QUEUE_MESSAGES as u32 + 10 {
            t.run(
                Direction::ToController,
                0,
                None,
                &build::echo_request(i, &[]),
            );
        }
        let (events, _) = sub.take();
        assert_eq!(events[0], Event::Dropped { messages: 10 });
        assert_eq!(events.len(), QUEUE_MESSAGES + 1);
        // Bytes bound too: big messages stop at QUEUE_BYTES.
        let big = build::echo_request(0, &vec![0; 60_000]);
        for _ in 0..100 {
            t.run(Direction::ToController, 0, None, &big);
        }
        let (events, _) = sub.take();
        let kept = events.iter().map(Event::bytes).sum::<usize>();
        assert!(kept <= QUEUE_BYTES, "{kept}");
        assert!(matches!(events[0], Event::Dropped { messages } if messages > 0));
        assert!(sub.take().0.is_empty());
    }

    #[test]
    fn without_follow_watches_one_session_until_it_closes() {
        let taps = Taps::new();
        let sub = taps.subscribe("sw1", "openflow", false);
        let (a, b) = (tap(&taps, 1), tap(&taps, 2));
        a.run(Direction::ToSwitch, 0, None, &build::hello(1));
        b.run(Direction::ToSwitch, 0, None, &build::hello(2));
        a.closed();
        a.run(Direction::ToSwitch, 0, None, &build::hello(3));
        let (events, ended) = sub.take();
        assert!(ended);
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(matches!(events[1], Event::Close { session: 1, .. }));
    }
}
