//! A UDP socket for quinn with a [`Tap`] on it: something that sees, or
//! changes, what passes between quinn and the runtime's socket. The one
//! delegation of quinn's `AsyncUdpSocket` that the agents' socket wrappers
//! share: no ECN ([`crate::no_ecn::NoEcn`]) and the controller agent's roster
//! ([`crate::roster::Roster`]).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// What a [`Tapped`] socket does on the way; both default to nothing.
pub trait Tap: Send + Sync + 'static {
    /// The datagram(s) to send instead of `transmit` (None: `transmit` as is).
    fn outgoing<'a>(&self, _transmit: &Transmit<'a>) -> Option<Transmit<'a>> {
        None
    }

    /// Sees a received batch (`bufs` and `meta` hold exactly its datagrams)
    /// before quinn does, and may change its metadata.
    fn incoming(&self, _bufs: &[IoSliceMut<'_>], _meta: &mut [RecvMeta]) {}
}

impl<T: Tap> Tap for Arc<T> {
    fn outgoing<'a>(&self, transmit: &Transmit<'a>) -> Option<Transmit<'a>> {
        (**self).outgoing(transmit)
    }

    fn incoming(&self, bufs: &[IoSliceMut<'_>], meta: &mut [RecvMeta]) {
        (**self).incoming(bufs, meta)
    }
}

/// A runtime's socket with `tap` on it.
pub struct Tapped<T> {
    pub inner: Arc<dyn AsyncUdpSocket>,
    pub tap: T,
}

impl<T> fmt::Debug for Tapped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tapped<{}>({:?})",
            std::any::type_name::<T>(),
            self.inner
        )
    }
}

impl<T: Tap> AsyncUdpSocket for Tapped<T> {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        match self.tap.outgoing(transmit) {
            Some(changed) => self.inner.try_send(&changed),
            None => self.inner.try_send(transmit),
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let got = self.inner.poll_recv(cx, bufs, meta);
        if let Poll::Ready(Ok(n)) = got {
            self.tap.incoming(&bufs[..n], &mut meta[..n]);
        }
        got
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
