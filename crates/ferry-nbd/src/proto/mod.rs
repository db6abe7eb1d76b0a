//! Wire constants and the pure (I/O-free) encoders and decoders of the NBD
//! protocol, written from `doc/proto.md` of the NBD project.
//!
//! Everything that interprets bytes sent by the server lives here as plain
//! functions over byte slices, so that it can be fuzzed (`fuzz/`,
//! target `nbd_reply_decode`) and unit-tested without a socket. Every length
//! read off the wire is checked against the request it answers or a fixed
//! cap before anything is allocated.

// Layout: private submodules, everything re-exported here so callers keep
// using `proto::*`. `consts` and `names`: wire values and their names;
// `error`: `ProtoError`; `wire`: field readers; `options`: handshake
// options and option replies; `request`: request headers; `reply`: reply
// messages and `decode_reply`; `chunk`: structured reply chunks;
// `coverage`: `ReadCoverage`.
mod chunk;
mod consts;
mod coverage;
mod error;
mod names;
mod options;
mod reply;
mod request;
mod wire;

#[cfg(test)]
mod tests;

pub use chunk::{check_chunk_len, check_in_request, max_chunk_payload, parse_chunk_payload, Chunk};
pub use consts::*;
pub use coverage::ReadCoverage;
pub use error::ProtoError;
pub use names::{cmd_name, errno_name, opt_name, rep_name};
pub use options::{
    encode_go_data, encode_meta_context_data, encode_option, parse_greeting, parse_opt_reply,
    parse_opt_reply_header, Greeting, Info, OptReply, OptReplyHeader,
};
pub use reply::{
    decode_reply, parse_reply_header, reply_header_len, simple_reply_data_len, Decoded, ReplyHeader,
};
pub use request::{encode_request, RequestInfo};
