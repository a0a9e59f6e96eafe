//! One session: a local connection joined to its lanes (the role of OVS's
//! `rconn` for one connection, without any protocol of its own).
//!
//! Two pumps run side by side:
//! * **out**: local socket → [`Outbound`] → lane streams. It reads the local socket
//!   only after the previous batch was accepted by QUIC, so when a stream has no
//!   flow-control credit the agent stops reading and the local peer's own socket
//!   buffer fills: backpressure without unbounded queues.
//! * **in**: lane streams → [`Inbound`] → local socket. It reads QUIC only after the
//!   previous bytes were written locally, so a slow local peer stops the QUIC
//!   stream's flow-control window, and so the sender.
//!
//! End of stream is passed on (local EOF → QUIC FIN → local shutdown(SHUT_WR)), so a
//! close on one side is a close on the other. Any error aborts both directions
//! with a QUIC error code (RESET_STREAM and STOP_SENDING, RFC 9000 §3.1–§3.5) and
//! closes the local socket; other sessions are not affected. One log line
//! records how the session ended.

use bytes::Bytes;
use quicsdn_lanes::{Inbound, Outbound};
use quicsdn_transport::local::{LocalRead, LocalStream, LocalWrite};
use quicsdn_wire::FrameError;
use quicsdn_wire::preamble::code;
use quinn::{ReadError, RecvStream, SendStream, VarInt, WriteError};
use std::future::Future;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::services::Service;

/// One lane of a session: a bidirectional QUIC stream, with any bytes already read
/// from it past the preamble.
pub struct Lane {
    pub send: SendStream,
    pub recv: RecvStream,
    pub initial: Bytes,
}

/// Who is on each end, for logs.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// Identity of the switch this session belongs to.
    pub switch: Arc<str>,
    pub service: Arc<Service>,
    pub id: u64,
    /// What is on the local side: "OVS" on the switch agent, "controller" on the
    /// controller agent.
    pub local_name: &'static str,
    /// The agent on the other end of the QUIC connection.
    pub remote_name: &'static str,
}

/// Why one direction of a session stopped.
#[derive(Debug)]
enum End {
    /// The sender finished its side cleanly.
    Finished,
    /// Aborted because the other direction failed.
    Aborted,
    LocalMalformed(FrameError),
    LocalTruncated(usize),
    LocalIo(std::io::Error),
    RemoteMalformed(String),
    RemoteStopped(VarInt),
    RemoteReset(VarInt),
    ConnectionLost(quinn::ConnectionError),
}

impl End {
    /// The error code to abort the other direction with, if this end should stop
    /// the whole session.
    ///
    /// A peer's STOP_SENDING only says it wants no more data from us; the data it
    /// sent us is still delivered, so it does not abort our receiving direction
    /// (RFC 9000 §3.5: STOP_SENDING concerns the sending part only). A local peer
    /// that closed mid-message has closed; what it sent before is delivered.
    fn abort_code(&self) -> Option<u32> {
        match self {
            End::Finished | End::Aborted | End::LocalTruncated(_) | End::RemoteStopped(_) => None,
            End::LocalMalformed(_) => Some(code::MALFORMED_MESSAGE),
            End::RemoteMalformed(_) => Some(code::PROTOCOL_VIOLATION),
            End::LocalIo(_) | End::ConnectionLost(_) => Some(code::LOCAL_ABORT),
            End::RemoteReset(c) => Some(c.into_inner() as u32),
        }
    }

    /// True when the session's closing log line should explain this end.
    fn is_notable(&self) -> bool {
        !matches!(self, End::Finished | End::Aborted)
    }
}

fn write_end(e: WriteError) -> End {
    match e {
        WriteError::Stopped(c) => End::RemoteStopped(c),
        WriteError::ConnectionLost(e) => End::ConnectionLost(e),
        other => End::RemoteMalformed(other.to_string()),
    }
}

fn read_end(e: ReadError) -> End {
    match e {
        ReadError::Reset(c) => End::RemoteReset(c),
        ReadError::ConnectionLost(e) => End::ConnectionLost(e),
        other => End::RemoteMalformed(other.to_string()),
    }
}

/// Byte and message counts, for the closing log line.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    messages_out: u64,
    bytes_out: u64,
    bytes_in: u64,
}

/// Waits until an abort code is published.
async fn aborted(rx: &mut watch::Receiver<Option<u32>>) -> u32 {
    loop {
        if let Some(c) = *rx.borrow_and_update() {
            return c;
        }
        if rx.changed().await.is_err() {
            // The session dropped its sender: treat as an abort.
            return code::LOCAL_ABORT;
        }
    }
}

/// Runs `fut` unless an abort arrives first.
async fn or_abort<T>(
    rx: &mut watch::Receiver<Option<u32>>,
    fut: impl Future<Output = T>,
) -> Result<T, u32> {
    tokio::select! {
        biased;
        c = aborted(rx) => Err(c),
        v = fut => Ok(v),
    }
}

/// Runs a session to its end. Never panics on peer input; logs one line at the end.
pub async fn run(info: SessionInfo, local: LocalStream, lanes: Vec<Lane>) {
    let lane_count = lanes.len();
    let service = info.service.clone();
    info!(
        switch = %info.switch,
        service = %service.name,
        session = info.id,
        lanes = lane_count,
        "session opened"
    );
    let (rd, wr) = local.into_split();
    let (abort_tx, abort_rx) = watch::channel(None::<u32>);
    let mut sends = Vec::with_capacity(lane_count);
    let mut recvs = Vec::with_capacity(lane_count);
    for lane in lanes {
        sends.push(lane.send);
        recvs.push((lane.recv, lane.initial));
    }
    let outbound = Outbound::new(service.framing, service.max_message, lane_count);
    let inbound = Inbound::new(service.framing, service.max_message, lane_count);
    let mut counts = Counts::default();
    let out = pump_out(rd, outbound, sends, abort_rx.clone());
    let inn = pump_in(wr, inbound, recvs, abort_rx);
    tokio::pin!(out, inn);
    let (mut out_done, mut in_done) = (false, false);
    let mut first_failure: Option<(&'static str, End)> = None;
    while !out_done || !in_done {
        let (direction, end) = tokio::select! {
            (e, messages, bytes) = &mut out, if !out_done => {
                out_done = true;
                counts.messages_out = messages;
                counts.bytes_out = bytes;
                ("out", e)
            }
            (e, bytes) = &mut inn, if !in_done => {
                in_done = true;
                counts.bytes_in = bytes;
                ("in", e)
            }
        };
        if let Some(c) = end.abort_code() {
            let _ = abort_tx.send(Some(c));
        }
        if end.is_notable() {
            first_failure.get_or_insert((direction, end));
        } else {
            debug!(switch = %info.switch, service = %service.name, session = info.id, direction, "direction ended");
        }
    }
    log_end(&info, first_failure, counts);
}

fn log_end(info: &SessionInfo, failure: Option<(&'static str, End)>, c: Counts) {
    let (switch, service, session) = (&info.switch, &info.service.name, info.id);
    let Some((_, end)) = failure else {
        info!(
            %switch, %service, session,
            messages_out = c.messages_out, bytes_out = c.bytes_out, bytes_in = c.bytes_in,
            "session closed"
        );
        return;
    };
    let (local, remote) = (info.local_name, info.remote_name);
    let counts = (c.messages_out, c.bytes_out, c.bytes_in);
    match end {
        End::LocalMalformed(e) => warn!(
            %switch, %service, session,
            "session closed: malformed message from {local}: {e}"
        ),
        End::LocalTruncated(n) => warn!(
            %switch, %service, session,
            "session closed: {local} closed the connection in the middle of a message ({n} bytes discarded)"
        ),
        End::LocalIo(e) => {
            info!(%switch, %service, session, "session closed: {local} connection failed: {e}")
        }
        End::RemoteMalformed(e) => warn!(
            %switch, %service, session,
            "session closed: invalid data from the {remote}: {e}"
        ),
        End::RemoteStopped(code) | End::RemoteReset(code) => {
            let reason = code::describe(code.into_inner());
            if matches!(code.into_inner() as u32, code::LOCAL_ABORT | code::SHUTDOWN) {
                info!(%switch, %service, session, "session closed by the {remote}: {reason}");
            } else {
                warn!(%switch, %service, session, "session closed by the {remote}: {reason}");
            }
        }
        End::ConnectionLost(e) => {
            info!(%switch, %service, session, "session closed: QUIC connection lost: {e}")
        }
        End::Finished | End::Aborted => unreachable!("not failures"),
    }
    debug!(%switch, %service, session, ?counts, "session counters");
}

fn finish_all(sends: &mut [SendStream]) {
    for s in sends {
        let _ = s.finish();
    }
}

/// Returns how it ended, and the messages and bytes it sent.
async fn pump_out(
    rd: LocalRead,
    outbound: Outbound,
    sends: Vec<SendStream>,
    abort: watch::Receiver<Option<u32>>,
) -> (End, u64, u64) {
    let (mut messages, mut bytes) = (0, 0);
    let end = pump_out_inner(rd, outbound, sends, abort, &mut messages, &mut bytes).await;
    (end, messages, bytes)
}

async fn pump_out_inner(
    mut rd: LocalRead,
    mut outbound: Outbound,
    mut sends: Vec<SendStream>,
    mut abort: watch::Receiver<Option<u32>>,
    messages: &mut u64,
    bytes: &mut u64,
) -> End {
    let reset_all = |sends: &mut Vec<SendStream>, c: u32| {
        for s in sends.iter_mut() {
            let _ = s.reset(VarInt::from_u32(c));
        }
    };
    loop {
        let n = match or_abort(&mut abort, rd.read_buf(outbound.read_buf())).await {
            Err(c) => {
                reset_all(&mut sends, c);
                return End::Aborted;
            }
            Ok(Err(e)) => {
                reset_all(&mut sends, code::LOCAL_ABORT);
                return End::LocalIo(e);
            }
            Ok(Ok(n)) => n,
        };
        if n == 0 {
            // Whole messages already left; a trailing partial one is dropped, as the
            // local peer abandoned it.
            finish_all(&mut sends);
            let partial = outbound.partial_len();
            return if partial > 0 {
                End::LocalTruncated(partial)
            } else {
                End::Finished
            };
        }
        loop {
            let batch = match outbound.next_batch() {
                Ok(Some(b)) => b,
                Ok(None) => break,
                Err(e) => {
                    // Everything before the bad message has been sent: end the streams
                    // cleanly so the peer delivers it, then close.
                    finish_all(&mut sends);
                    return End::LocalMalformed(e);
                }
            };
            *messages += batch.messages as u64;
            *bytes += batch.bytes.len() as u64;
            let send = &mut sends[batch.lane];
            match or_abort(&mut abort, send.write_chunk(batch.bytes)).await {
                Err(c) => {
                    reset_all(&mut sends, c);
                    return End::Aborted;
                }
                Ok(Err(e)) => {
                    reset_all(&mut sends, code::LOCAL_ABORT);
                    return write_end(e);
                }
                Ok(Ok(())) => {}
            }
        }
    }
}

/// Returns how it ended, and the bytes it delivered locally.
async fn pump_in(
    wr: LocalWrite,
    inbound: Inbound,
    recvs: Vec<(RecvStream, Bytes)>,
    abort: watch::Receiver<Option<u32>>,
) -> (End, u64) {
    let mut bytes = 0;
    let end = pump_in_inner(wr, inbound, recvs, abort, &mut bytes).await;
    (end, bytes)
}

/// A chunk read from a lane: `Ok(None)` when the lane finished.
type LaneRead = (usize, Result<Option<Bytes>, ReadError>);

/// Where the in-direction reads lanes from. One lane is read in place; several are
/// read by one task each into a small bounded channel, whose capacity is then the
/// only buffering between QUIC and the local socket.
enum LaneReader {
    Single {
        recv: RecvStream,
        initial: Option<Bytes>,
        done: bool,
    },
    Multi {
        rx: mpsc::Receiver<LaneRead>,
        stop: watch::Sender<Option<u32>>,
        readers: tokio::task::JoinSet<()>,
    },
}

impl LaneReader {
    fn new(mut recvs: Vec<(RecvStream, Bytes)>) -> LaneReader {
        if recvs.len() == 1 {
            let (recv, initial) = recvs.pop().expect("one lane");
            return LaneReader::Single {
                recv,
                initial: (!initial.is_empty()).then_some(initial),
                done: false,
            };
        }
        let (tx, rx) = mpsc::channel::<LaneRead>(recvs.len() * 2);
        let (stop, stop_rx) = watch::channel(None::<u32>);
        let mut readers = tokio::task::JoinSet::new();
        for (lane, (mut recv, initial)) in recvs.into_iter().enumerate() {
            let tx = tx.clone();
            let mut stop = stop_rx.clone();
            readers.spawn(async move {
                if !initial.is_empty() && tx.send((lane, Ok(Some(initial)))).await.is_err() {
                    return;
                }
                loop {
                    let r = match or_abort(&mut stop, recv.read_chunk(usize::MAX, true)).await {
                        Err(c) => {
                            let _ = recv.stop(VarInt::from_u32(c));
                            return;
                        }
                        Ok(r) => r.map(|c| c.map(|c| c.bytes)),
                    };
                    let last = !matches!(r, Ok(Some(_)));
                    if tx.send((lane, r)).await.is_err() || last {
                        if !last {
                            let _ = recv.stop(VarInt::from_u32(code::LOCAL_ABORT));
                        }
                        return;
                    }
                }
            });
        }
        LaneReader::Multi { rx, stop, readers }
    }

    /// The next chunk of any lane; `None` only if the lane readers died.
    async fn next(&mut self) -> Option<LaneRead> {
        match self {
            LaneReader::Single {
                recv,
                initial,
                done,
            } => {
                if let Some(b) = initial.take() {
                    return Some((0, Ok(Some(b))));
                }
                let r = recv
                    .read_chunk(usize::MAX, true)
                    .await
                    .map(|c| c.map(|c| c.bytes));
                *done = !matches!(r, Ok(Some(_)));
                Some((0, r))
            }
            LaneReader::Multi { rx, .. } => rx.recv().await,
        }
    }

    /// Asks the peer to stop sending on every unfinished lane (STOP_SENDING with
    /// `c`) and waits until the readers are gone.
    async fn stop(self, c: Option<u32>) {
        match self {
            LaneReader::Single { mut recv, done, .. } => {
                if let (Some(c), false) = (c, done) {
                    let _ = recv.stop(VarInt::from_u32(c));
                }
            }
            LaneReader::Multi {
                stop, mut readers, ..
            } => {
                let _ = stop.send(c);
                if c.is_none() {
                    // Finished normally: every reader has already returned.
                    readers.abort_all();
                }
                while readers.join_next().await.is_some() {}
            }
        }
    }
}

async fn pump_in_inner(
    mut wr: LocalWrite,
    mut inbound: Inbound,
    recvs: Vec<(RecvStream, Bytes)>,
    mut abort: watch::Receiver<Option<u32>>,
    bytes: &mut u64,
) -> End {
    let mut lanes = LaneReader::new(recvs);
    let (end, stop) = loop {
        let (lane, r) = match or_abort(&mut abort, lanes.next()).await {
            Err(c) => break (End::Aborted, Some(c)),
            Ok(None) => {
                break (
                    End::RemoteMalformed("a lane reader ended unexpectedly".into()),
                    Some(code::LOCAL_ABORT),
                );
            }
            Ok(Some(item)) => item,
        };
        match r {
            Ok(Some(chunk)) => match inbound.push(lane, chunk) {
                Ok(Some(out)) => {
                    *bytes += out.len() as u64;
                    match or_abort(&mut abort, wr.write_all(&out)).await {
                        Err(c) => break (End::Aborted, Some(c)),
                        Ok(Err(e)) => break (End::LocalIo(e), Some(code::LOCAL_ABORT)),
                        Ok(Ok(())) => {}
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    break (
                        End::RemoteMalformed(format!("lane {lane}: {e}")),
                        Some(code::PROTOCOL_VIOLATION),
                    );
                }
            },
            Ok(None) => match inbound.finish(lane) {
                Ok(true) => {
                    let _ = wr.shutdown().await;
                    break (End::Finished, None);
                }
                Ok(false) => {}
                Err(e) => {
                    break (
                        End::RemoteMalformed(e.to_string()),
                        Some(code::PROTOCOL_VIOLATION),
                    );
                }
            },
            Err(e) => break (read_end(e), Some(code::LOCAL_ABORT)),
        }
    };
    lanes.stop(stop).await;
    end
}

/// Refuses a session's lanes: reset our sending side and ask the peer to stop, both
/// with `code`, so the opener learns why.
pub fn refuse(lanes: Vec<Lane>, c: u32) {
    for mut lane in lanes {
        let _ = lane.send.reset(VarInt::from_u32(c));
        let _ = lane.recv.stop(VarInt::from_u32(c));
    }
}
