//! When the switch agent answers OVS's OpenFlow HELLO on the controller's
//! behalf (the HELLO stand-in, [`quicsdn_lanes::hello`]). No I/O, no clock:
//! the switch agent feeds in what it knows of its link to the controller agent
//! and how the last connection or attempt ended.
//!
//! Two things pull in opposite directions:
//!
//! * OVS gives a new controller connection about a second to deliver the
//!   controller's HELLO (OpenFlow 1.3.5 §6.3.1: "each side of the connection
//!   must immediately send an OFPT_HELLO message"), then drops it and backs
//!   off. After a controller-agent restart under 1,000 switches, the real HELLO
//!   takes longer than that, also on a 0-RTT connection that is usable at once
//!   but reaches a controller agent still busy with everyone else's handshakes.
//! * OVS's fail mode must still see its controller go away when no controller
//!   agent is reachable: a stand-in HELLO makes OVS believe it has a
//!   controller, so it must not be sent on a link known to be dead.
//!
//! So the stand-in engages when the link is **not known dead**: it is up, or it
//! is a connection or attempt that has not heard from the controller agent yet
//! after the previous one ended in a way that says a controller agent runs
//! there (it closed the connection, as on SIGTERM; its successor reset the old
//! connection, after a crash; it refused us while busy; it rejected 0-RTT). It
//! does not engage after the link went silent past the grace period or an
//! attempt got no answer, until a new connection has heard from a controller
//! agent again. That bounds how long OVS can be kept believing in a controller
//! that is not coming back: one connection attempt, which gives up within the
//! grace period.

/// The switch agent's link to the controller agent when OVS opens an OpenFlow
/// connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkView {
    /// A connection whose handshake completed and that has not closed: it has
    /// heard from the controller agent.
    Up,
    /// A 0-RTT connection, usable at once, whose handshake has not completed:
    /// the controller agent has not answered it yet.
    Unconfirmed,
    /// An attempt with a full handshake is under way.
    Connecting,
    /// No connection, and no attempt right now (a backoff).
    Down,
}

/// What the last connection or attempt to end says about the controller agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A controller agent answered: it closed the connection, reset it,
    /// refused or rejected 0-RTT. It is running, or restarting.
    Answering,
    /// No answer: the connection went silent past the grace period, or the
    /// attempt failed. Also the state before the first connection.
    Silent,
}

/// How a connection or attempt ended, as the connection manager sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The controller agent refused the attempt (admission control).
    Refused,
    /// The controller agent rejected 0-RTT; a full handshake follows at once.
    ZeroRttRejected,
    /// An attempt that produced no connection (unreachable, handshake failed,
    /// or no answer within the grace period).
    AttemptFailed,
    /// A connection closed, with why, and whether its handshake had completed.
    Lost {
        reason: quinn::ConnectionError,
        confirmed: bool,
    },
}

impl Verdict {
    /// The verdict after a connection or attempt ended.
    pub fn after(ending: &Ending) -> Verdict {
        use quinn::ConnectionError as E;
        match ending {
            Ending::Refused | Ending::ZeroRttRejected => Verdict::Answering,
            Ending::AttemptFailed => Verdict::Silent,
            Ending::Lost { reason, confirmed } => match reason {
                // Silent past the grace period: the controller agent is gone
                // or out of reach, and OVS must learn it.
                E::TimedOut => Verdict::Silent,
                // A stateless reset (RFC 9000 §10.3) comes from a controller
                // agent holding the restart-stable reset key: the crashed one's
                // successor is up.
                E::Reset => Verdict::Answering,
                // We closed it (failback to the first controller agent, which
                // just answered; shutdown).
                E::LocallyClosed => Verdict::Answering,
                // The controller agent closed an established connection (a
                // restart, or it took a newer connection for this switch).
                E::ApplicationClosed(_) | E::ConnectionClosed(_) if *confirmed => {
                    Verdict::Answering
                }
                // Closed before the handshake completed (a TLS refusal of our
                // certificate, a version mismatch): it may answer every attempt
                // the same way, so OVS must not be held through that. An
                // application's close this early arrives without its code
                // (RFC 9000 §10.2.3: APPLICATION_ERROR), so a stopping
                // controller agent admits no attempt it would close
                // (`ControllerAgent::stop_serving`).
                E::ApplicationClosed(_)
                | E::ConnectionClosed(_)
                | E::VersionMismatch
                | E::TransportError(_)
                | E::CidsExhausted => Verdict::Silent,
            },
        }
    }
}

/// Whether OVS's new OpenFlow connection gets the controller's remembered
/// HELLO at once: the stand-in is on (`--no-hello-stand-in` not given), a
/// HELLO is remembered from an earlier session, and the link is not known
/// dead (see the module's comment).
pub fn engages(enabled: bool, remembered: bool, link: LinkView, last: Verdict) -> bool {
    if !enabled || !remembered {
        return false;
    }
    match link {
        LinkView::Up => true,
        LinkView::Unconfirmed | LinkView::Connecting | LinkView::Down => last == Verdict::Answering,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::ConnectionError as E;

    const LINKS: [LinkView; 4] = [
        LinkView::Up,
        LinkView::Unconfirmed,
        LinkView::Connecting,
        LinkView::Down,
    ];

    #[test]
    fn every_link_state_with_and_without_a_remembered_hello() {
        for link in LINKS {
            for last in [Verdict::Answering, Verdict::Silent] {
                // Nothing remembered (the first session) or the stand-in off:
                // OVS waits for the controller's own HELLO.
                assert!(!engages(true, false, link, last), "{link:?} {last:?}");
                assert!(!engages(false, true, link, last), "{link:?} {last:?}");
                let want = match (link, last) {
                    // Up: it heard from the controller agent.
                    (LinkView::Up, _) => true,
                    // Not yet heard from, after a controller agent answered.
                    (_, Verdict::Answering) => true,
                    // Known dead: OVS's fail mode must see it.
                    (_, Verdict::Silent) => false,
                };
                assert_eq!(engages(true, true, link, last), want, "{link:?} {last:?}");
            }
        }
    }

    #[test]
    fn a_controller_agent_that_answered_keeps_the_stand_in() {
        let closed = E::ApplicationClosed(quinn::ApplicationClose {
            error_code: quinn::VarInt::from_u32(0),
            reason: bytes::Bytes::from_static(b"shutting down"),
        });
        for ending in [
            Ending::Refused,
            Ending::ZeroRttRejected,
            Ending::Lost {
                reason: closed,
                confirmed: true,
            },
            Ending::Lost {
                reason: E::Reset,
                confirmed: true,
            },
            // A 0-RTT connection to the crashed agent's address, reset by its successor.
            Ending::Lost {
                reason: E::Reset,
                confirmed: false,
            },
            Ending::Lost {
                reason: E::LocallyClosed,
                confirmed: true,
            },
        ] {
            assert_eq!(Verdict::after(&ending), Verdict::Answering, "{ending:?}");
        }
    }

    #[test]
    fn silence_and_failed_attempts_stop_the_stand_in() {
        let refused_tls = E::ConnectionClosed(quinn::ConnectionClose {
            error_code: quinn::TransportErrorCode::crypto(42),
            frame_type: None,
            reason: bytes::Bytes::from_static(b"bad certificate"),
        });
        for ending in [
            Ending::AttemptFailed,
            // The grace period ran out on an established connection.
            Ending::Lost {
                reason: E::TimedOut,
                confirmed: true,
            },
            // A 0-RTT attempt whose handshake never completed.
            Ending::Lost {
                reason: E::TimedOut,
                confirmed: false,
            },
            // Refused during the handshake: every attempt may be.
            Ending::Lost {
                reason: refused_tls,
                confirmed: false,
            },
        ] {
            assert_eq!(Verdict::after(&ending), Verdict::Silent, "{ending:?}");
        }
    }
}
