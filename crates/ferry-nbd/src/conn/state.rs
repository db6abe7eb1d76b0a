//! The state shared by submitters and the reader thread: the table of
//! requests in flight, flow control, and why the connection died; failing
//! the connection fails every request in it.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

use super::lock;
use super::socket::Sock;
use super::ticket::{Reply, Slot};
use crate::error::{Error, Result};
use crate::proto::*;

#[derive(Clone, Debug)]
pub(super) enum Dead {
    Closed,
    Eof,
    Io(String),
    Protocol(ProtoError),
    Timeout(u64),
}

impl Dead {
    pub(super) fn to_error(&self) -> Error {
        match self {
            Dead::Closed => Error::ConnectionLost("connection closed by the client".into()),
            Dead::Eof => Error::ConnectionLost("server closed the connection".into()),
            Dead::Io(s) => Error::ConnectionLost(s.clone()),
            Dead::Protocol(p) => Error::Protocol(p.clone()),
            Dead::Timeout(s) => Error::Timeout { secs: *s },
        }
    }
}

pub(super) enum PendingKind {
    Read { buf: Vec<u8>, cov: ReadCoverage },
    BlockStatus { extents: Option<Vec<(u32, u32)>> },
    Other,
}

pub(super) struct Pending {
    pub(super) req: RequestInfo,
    pub(super) kind: PendingKind,
    pub(super) error: Option<Error>,
    pub(super) slot: Arc<Slot>,
}

pub(super) struct State {
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) in_flight: usize,
    pub(super) dead: Option<Dead>,
}

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) space: Condvar,
    pub(super) max_in_flight: usize,
    pub(super) closing: AtomicBool,
    /// The server answered ESHUTDOWN: no new requests, disconnect softly.
    pub(super) server_shutdown: AtomicBool,
    /// A clone of the socket used only to shut it down.
    killer: Sock,
}

impl Shared {
    pub(super) fn new(max_in_flight: usize, killer: Sock) -> Shared {
        Shared {
            state: Mutex::new(State {
                pending: HashMap::new(),
                in_flight: 0,
                dead: None,
            }),
            space: Condvar::new(),
            max_in_flight,
            closing: AtomicBool::new(false),
            server_shutdown: AtomicBool::new(false),
            killer,
        }
    }

    /// Marks the connection dead, shuts the socket, and fails every request.
    pub(super) fn fail(&self, why: Dead) {
        let drained: Vec<Pending> = {
            let mut st = lock(&self.state);
            if st.dead.is_none() {
                st.dead = Some(why);
            }
            let d: Vec<Pending> = st.pending.drain().map(|(_, p)| p).collect();
            st.in_flight -= d.len();
            d
        };
        self.killer.shutdown();
        let err = lock(&self.state).dead.clone().unwrap_or(Dead::Closed);
        for p in drained {
            p.slot.complete(Err(err.to_error()));
        }
        self.space.notify_all();
    }

    pub(super) fn finish(&self, p: Pending, r: Result<Reply>) {
        {
            let mut st = lock(&self.state);
            st.in_flight -= 1;
        }
        self.space.notify_all();
        p.slot.complete(r);
    }
}
