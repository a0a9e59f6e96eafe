//! One TCP connection joined to one bidirectional QUIC stream, with TCP's
//! semantics carried across:
//!
//! | TCP side                        | QUIC stream                                   |
//! |---------------------------------|-----------------------------------------------|
//! | bytes                           | STREAM frames, in order (RFC 9000 §2.2)       |
//! | FIN (read returns 0)            | FIN: `finish()` (§3.1), the other way goes on  |
//! | RST received (ECONNRESET, EPIPE)| RESET_STREAM + STOP_SENDING, [`code::TCP_RESET`] (§3.5) |
//! | RST sent (SO_LINGER 0, close)   | RESET_STREAM or STOP_SENDING received, or the connection lost |
//!
//! Each direction copies through one fixed buffer: it reads only when the
//! previous chunk has been written, so a slow reader on either side stops the
//! other side through TCP's window and QUIC's flow control, and nothing here
//! grows without bound.

use crate::code;
use quinn::{Connection, ConnectionError, ReadError, RecvStream, SendStream, VarInt, WriteError};
use std::io;
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes read from TCP at a time.
const CHUNK: usize = 64 * 1024;

/// How a spliced connection ended.
#[derive(Debug)]
pub enum Ending {
    /// Both directions closed with FIN.
    Closed,
    /// The local TCP peer reset (or its socket failed); the QUIC stream was
    /// reset both ways.
    LocalReset(io::Error),
    /// The other proxy reset the stream (its TCP peer reset, its target refused,
    /// …): the local TCP connection was reset.
    PeerReset(VarInt),
    /// The QUIC connection ended: the local TCP connection was reset.
    Lost(ConnectionError),
    /// The other proxy broke the stream protocol: the local TCP connection was
    /// reset.
    Protocol(String),
}

impl Ending {
    /// A few words for a log line.
    pub fn describe(&self) -> String {
        match self {
            Ending::Closed => "closed".into(),
            Ending::LocalReset(e) => format!("reset by the local TCP peer ({e})"),
            Ending::PeerReset(c) => format!("reset by the other proxy: {}", code::describe(*c)),
            Ending::Lost(e) => format!("QUIC connection lost ({e})"),
            Ending::Protocol(e) => format!("stream protocol error ({e})"),
        }
    }
}

/// What a splice moved, and how it ended.
#[derive(Debug)]
pub struct Report {
    /// TCP → QUIC.
    pub sent: u64,
    /// QUIC → TCP.
    pub received: u64,
    pub ending: Ending,
}

impl From<WriteError> for Ending {
    fn from(e: WriteError) -> Ending {
        match e {
            WriteError::Stopped(c) => Ending::PeerReset(c),
            WriteError::ConnectionLost(e) => Ending::Lost(e),
            e => Ending::Protocol(e.to_string()),
        }
    }
}

impl From<ReadError> for Ending {
    fn from(e: ReadError) -> Ending {
        match e {
            ReadError::Reset(c) => Ending::PeerReset(c),
            ReadError::ConnectionLost(e) => Ending::Lost(e),
            e => Ending::Protocol(e.to_string()),
        }
    }
}

// The copies use `&TcpStream` (readiness plus `try_read`/`try_write`) rather
// than split halves, so that a third future can watch the same socket for a
// reset while the other two run.

async fn tcp_read(tcp: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        tcp.readable().await?;
        match tcp.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn tcp_write_all(tcp: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        tcp.writable().await?;
        match tcp.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn tcp_to_quic(
    tcp: &TcpStream,
    quic: &mut SendStream,
    moved: &mut u64,
) -> Result<(), Ending> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = tcp_read(tcp, &mut buf).await.map_err(Ending::LocalReset)?;
        if n == 0 {
            // RFC 9000 §3.1: "the final size ... is sent": the peer sees a
            // clean end of this direction, and may go on sending.
            let _ = quic.finish();
            return Ok(());
        }
        quic.write_all(&buf[..n]).await?;
        *moved += n as u64;
    }
}

async fn quic_to_tcp(
    quic: &mut RecvStream,
    tcp: &TcpStream,
    moved: &mut u64,
) -> Result<(), Ending> {
    while let Some(chunk) = quic.read_chunk(CHUNK, true).await? {
        tcp_write_all(tcp, &chunk.bytes)
            .await
            .map_err(Ending::LocalReset)?;
        *moved += chunk.bytes.len() as u64;
    }
    // The other side's FIN: half-close ours, keep reading ours.
    socket2::SockRef::from(tcp)
        .shutdown(std::net::Shutdown::Write)
        .map_err(Ending::LocalReset)
}

/// After the local peer's FIN the socket has nothing more to read, but the
/// peer may still reset it, and nothing else would notice while the other
/// direction waits for data: wait for the socket's error event (EPOLLERR,
/// which a received RST raises). Never returns otherwise.
async fn watch_for_reset(tcp: &TcpStream) -> Ending {
    let _ = tcp.ready(Interest::ERROR).await;
    match tcp.take_error() {
        Ok(Some(e)) | Err(e) => Ending::LocalReset(e),
        Ok(None) => std::future::pending().await,
    }
}

/// Makes closing `tcp` send RST instead of FIN (SO_LINGER 0; whatever is
/// unsent is dropped), as a TCP stack does to a connection it cannot carry
/// on. The proxy arms this as soon as it holds a connection, so that every
/// way of dropping it short of a clean end (an error, a shutdown, an aborted
/// task) resets it: a peer never mistakes a failure for a clean close.
/// [`splice`] disarms it after both directions closed cleanly.
pub fn arm_reset(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO));
}

/// Resets a TCP connection (see [`arm_reset`]).
pub fn reset_tcp(tcp: TcpStream) {
    arm_reset(&tcp);
    drop(tcp);
}

/// Carries `tcp` over (`send`, `recv`) until both directions have closed, or
/// one side resets, or `conn` ends. Consumes everything: on return the TCP
/// connection is closed (with FIN after a clean end, with RST otherwise) and
/// the stream is finished or reset.
pub async fn splice(
    tcp: TcpStream,
    mut send: SendStream,
    mut recv: RecvStream,
    conn: &Connection,
) -> Report {
    arm_reset(&tcp);
    let (mut sent, mut received) = (0, 0);
    // STOP_SENDING from the other proxy (its TCP peer reset): noticed at once,
    // not only at our next write, which may never come.
    let stopped = send.stopped();
    let ending = {
        let up = tcp_to_quic(&tcp, &mut send, &mut sent);
        let down = quic_to_tcp(&mut recv, &tcp, &mut received);
        tokio::pin!(up, down, stopped);
        let (mut up_done, mut down_done, mut acked) = (false, false, false);
        loop {
            tokio::select! {
                r = &mut up, if !up_done => match r {
                    Ok(()) => up_done = true,
                    Err(e) => break e,
                },
                r = &mut down, if !down_done => match r {
                    Ok(()) => down_done = true,
                    Err(e) => break e,
                },
                e = watch_for_reset(&tcp), if up_done && !down_done => break e,
                r = &mut stopped, if !acked => match r {
                    Ok(Some(c)) => break Ending::PeerReset(c),
                    // Finished and all acknowledged: nothing left to stop.
                    Ok(None) => acked = true,
                    Err(e) => break Ending::Protocol(e.to_string()),
                },
                // A direction waiting on TCP alone (an idle application, or one
                // that stopped reading) must still learn that the connection
                // is gone.
                e = conn.closed() => break Ending::Lost(e),
            }
            if up_done && down_done {
                break Ending::Closed;
            }
        }
    };
    match &ending {
        Ending::Closed => {
            // Both FINs exchanged: close normally.
            let _ = socket2::SockRef::from(&tcp).set_linger(None);
        }
        Ending::LocalReset(_) => {
            // RFC 9000 §3.5: RESET_STREAM abandons our direction, STOP_SENDING
            // asks the peer to abandon its own.
            let _ = send.reset(code::TCP_RESET.into());
            let _ = recv.stop(code::TCP_RESET.into());
            reset_tcp(tcp);
        }
        Ending::PeerReset(c) => {
            let _ = send.reset(*c);
            let _ = recv.stop(*c);
            reset_tcp(tcp);
        }
        Ending::Protocol(_) => {
            let _ = send.reset(code::PROTOCOL.into());
            let _ = recv.stop(code::PROTOCOL.into());
            reset_tcp(tcp);
        }
        Ending::Lost(_) => reset_tcp(tcp),
    }
    Report {
        sent,
        received,
        ending,
    }
}
