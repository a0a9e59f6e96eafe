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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};

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

async fn tcp_to_quic(
    tcp: &mut ReadHalf<'_>,
    quic: &mut SendStream,
    moved: &mut u64,
) -> Result<(), Ending> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = tcp.read(&mut buf).await.map_err(Ending::LocalReset)?;
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
    tcp: &mut WriteHalf<'_>,
    moved: &mut u64,
) -> Result<(), Ending> {
    while let Some(chunk) = quic.read_chunk(CHUNK, true).await? {
        tcp.write_all(&chunk.bytes)
            .await
            .map_err(Ending::LocalReset)?;
        *moved += chunk.bytes.len() as u64;
    }
    // The other side's FIN: half-close ours, keep reading ours.
    tcp.shutdown().await.map_err(Ending::LocalReset)
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
    mut tcp: TcpStream,
    mut send: SendStream,
    mut recv: RecvStream,
    conn: &Connection,
) -> Report {
    arm_reset(&tcp);
    let (mut sent, mut received) = (0, 0);
    let ending = {
        let (mut r, mut w) = tcp.split();
        let up = tcp_to_quic(&mut r, &mut send, &mut sent);
        let down = quic_to_tcp(&mut recv, &mut w, &mut received);
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
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
