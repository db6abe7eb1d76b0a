//! One NBD connection: the handshake, then a transmission phase with many
//! requests in flight.
//!
//! Design: submitters take a writer mutex to send a request; a dedicated
//! reader thread decodes every reply and hands it, by cookie, to the
//! [`Ticket`] of the request it answers. READ payloads are read straight
//! from the socket into the request's buffer. When the connection fails
//! (EOF, I/O error, protocol violation, timeout) every request in flight and
//! every later one fails with an error; nothing waits forever.

use std::sync::{Mutex, MutexGuard};

// Layout: `info`: `ConnectOptions`, `ExportInfo`; `socket`: TCP or unix
// stream; `handshake`: option haggling up to `NBD_OPT_GO`; `connection`:
// `Connection` setup, accessors, disconnect; `pipeline`: the `submit_*`
// methods (checks, flow control, sending); `ticket`: `Ticket`, `Reply`;
// `state`: the table of requests in flight shared with the reader;
// `reader`: the reply reader thread.
mod connection;
mod handshake;
mod info;
mod pipeline;
mod reader;
mod socket;
mod state;
mod ticket;

pub use connection::Connection;
pub use info::{ConnectOptions, ExportInfo};
pub use ticket::{Reply, Ticket};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not turn into a second panic here.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
