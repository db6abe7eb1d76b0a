//! The seed corpus, made from real encodings: messages encoded by
//! ferry-link's codec, blocks packed by ferry-compress, frames sealed by
//! ferry-channel, signatures computed by ferry-delta, replies laid out as
//! the NBD spec says. `cargo run --example gen_corpus` writes them to
//! `corpus/<target>/<name>`; `tests/corpus.rs` checks that the committed
//! corpus holds them and replays it.

mod engine;
mod guest;
mod sender;
mod stripe;
mod wire;

/// (target, seed name, bytes).
pub type Seed = (&'static str, String, Vec<u8>);

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut v = Vec::new();
    engine::frame(&mut v);
    engine::receiver_sequence(&mut v);
    sender::sender_sequence(&mut v);
    sender::listcheck(&mut v);
    wire::stream_messages(&mut v);
    wire::stream_control(&mut v);
    wire::channel_handshake(&mut v);
    wire::channel_frames(&mut v);
    wire::nbd_replies(&mut v);
    wire::nbd_client(&mut v);
    wire::delta_signature(&mut v);
    wire::sig_cache(&mut v);
    wire::decompress(&mut v);
    wire::journal(&mut v);
    wire::daemon_request(&mut v);
    guest::guest_image(&mut v);
    stripe::stripe(&mut v);
    v
}

/// Text that compresses: `n` bytes of a phrase with a counter.
pub fn text(n: usize, seed: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 64);
    let mut i = 0u32;
    while v.len() < n {
        v.extend_from_slice(format!("{seed} {i} ferry moves data; ").as_bytes());
        i += 1;
    }
    v.truncate(n);
    v
}

/// A message's frame body.
pub fn body(m: &ferry_link::Message) -> Vec<u8> {
    let mut v = Vec::new();
    ferry_link::encode(m, &mut v);
    v
}
