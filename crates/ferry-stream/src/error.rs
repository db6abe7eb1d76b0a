//! The stream engine's errors: an [`ErrorKind`] that picks the exit code
//! (and travels in FAIL messages), and how channel errors map to it.

use std::io::{self};

use ferry_channel::ChannelError;

/// Declares [`ErrorKind`] and `ErrorKind::ALL` from one list of kinds, so
/// that the wire codes (the order of the list) cannot drift from the enum.
macro_rules! error_kinds {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// What went wrong, coarse enough to pick an exit code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ErrorKind {
            $($(#[$doc])* $kind,)*
        }

        impl ErrorKind {
            /// Every kind, in wire-code order.
            const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind,)*];
        }
    };
}

error_kinds! {
    /// Bad options (block size, key).
    Usage,
    /// The peer does not hold the same key.
    WrongKey,
    /// The listen address is taken.
    AddrInUse,
    /// Connecting failed (refused, unreachable, timed out).
    Unreachable,
    /// The local consumer stopped reading (EPIPE on our output).
    ConsumerExited,
    /// The remote consumer stopped reading.
    PeerConsumerExited,
    /// Reading the input failed (locally, or at the sender).
    ProducerFailed,
    /// The peer went away mid-stream (connection lost, stream truncated).
    PeerKilled,
    /// A frame failed authentication, or the end-of-stream total or digest
    /// did not match, or the peer broke the protocol.
    Integrity,
    /// Local I/O error (output file, socket setup).
    Io,
    /// The peer sent nothing, not even a keepalive, for `--timeout`.
    TimedOut,
}

impl ErrorKind {
    /// Whether a new connection could go past this: the peer went away, was
    /// unreachable or timed out. Everything else would fail the same way.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::PeerKilled | ErrorKind::TimedOut | ErrorKind::Unreachable
        )
    }

    /// Wire code in FAIL messages.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The kind of wire code `c`; an unknown code reads as integrity.
    pub(crate) fn from_code(c: u8) -> ErrorKind {
        Self::ALL
            .get(c as usize)
            .copied()
            .unwrap_or(ErrorKind::Integrity)
    }
}

/// An error of the stream engine.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{msg}")]
pub struct StreamError {
    pub kind: ErrorKind,
    pub msg: String,
    /// Exit status of the remote command, when the peer reported one.
    pub remote_status: Option<i32>,
}

impl StreamError {
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> StreamError {
        StreamError {
            kind,
            msg: msg.into(),
            remote_status: None,
        }
    }
}

pub(crate) fn channel_err(e: ChannelError, what: &str) -> StreamError {
    match e {
        ChannelError::WrongKey => StreamError::new(ErrorKind::WrongKey, e.to_string()),
        ChannelError::KeyTooShort(_) => StreamError::new(ErrorKind::Usage, e.to_string()),
        ChannelError::Truncated => {
            StreamError::new(ErrorKind::PeerKilled, format!("stream truncated: {what}"))
        }
        ChannelError::BadHello(_) => StreamError::new(ErrorKind::Unreachable, e.to_string()),
        ChannelError::Io(ref io) => match io.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                StreamError::new(ErrorKind::TimedOut, format!("{what}: {io}"))
            }
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => StreamError::new(
                ErrorKind::PeerKilled,
                format!("stream truncated: {what}: {e}"),
            ),
            _ => StreamError::new(ErrorKind::Io, format!("{what}: {e}")),
        },
        other => StreamError::new(ErrorKind::Integrity, format!("{what}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_or_silent_peer_is_worth_a_retry_nothing_else_is() {
        use ErrorKind::*;
        for k in [PeerKilled, TimedOut, Unreachable] {
            assert!(k.retryable(), "{k:?}");
        }
        for k in [
            Usage,
            WrongKey,
            AddrInUse,
            ConsumerExited,
            PeerConsumerExited,
            ProducerFailed,
            Integrity,
            Io,
        ] {
            assert!(!k.retryable(), "{k:?}");
        }
        // The codes round-trip through FAIL, unknown ones read as integrity.
        for c in 0..=10u8 {
            assert_eq!(ErrorKind::from_code(c).code(), c);
        }
        assert_eq!(ErrorKind::from_code(200), Integrity);
    }
}
