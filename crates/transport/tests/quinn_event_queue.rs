//! The tests of the one change this project makes to quinn
//! (third_party/quinn/QUICSDN-PATCH.md): its event queue, compiled from the
//! vendored file itself, since the vendored crate is not a workspace member.

#[path = "../../../third_party/quinn/src/event_queue.rs"]
mod event_queue;
