//! Fuzz targets for every decoder of bytes a peer (or a server) sends
//! ferry. Each target's logic is a plain `run(&[u8])` here, so that
//! `fuzz_targets/<name>.rs` is one line for libFuzzer (`cargo +nightly fuzz
//! run <name>`) and `tests/corpus.rs` replays the committed corpus on
//! stable. See `README.md` for what each target asserts and how the seed
//! corpus is made ([`seeds`]).

pub mod channel_frames;
pub mod channel_handshake;
pub mod daemon_request;
pub mod decompress;
pub mod delta_signature;
pub mod frame;
pub mod guest_image;
pub mod journal;
pub mod listcheck;
pub mod nbd_client;
pub mod nbd_replies;
pub mod receiver_sequence;
pub mod seeds;
pub mod sender_sequence;
pub mod sig_cache;
pub mod stream_control;
pub mod stream_messages;
pub mod stripe;
pub mod util;

/// A target's entry point.
pub type Target = fn(&[u8]);

/// Every target: its name (that of its `fuzz_targets/` file and corpus
/// directory) and its entry point.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame::run),
    ("receiver_sequence", receiver_sequence::run),
    ("sender_sequence", sender_sequence::run),
    ("stream_messages", stream_messages::run),
    ("stream_control", stream_control::run),
    ("channel_handshake", channel_handshake::run),
    ("channel_frames", channel_frames::run),
    ("nbd_replies", nbd_replies::run),
    ("nbd_client", nbd_client::run),
    ("listcheck", listcheck::run),
    ("delta_signature", delta_signature::run),
    ("sig_cache", sig_cache::run),
    ("decompress", decompress::run),
    ("journal", journal::run),
    ("daemon_request", daemon_request::run),
    ("guest_image", guest_image::run),
    ("stripe", stripe::run),
];

/// The entry point of target `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}
