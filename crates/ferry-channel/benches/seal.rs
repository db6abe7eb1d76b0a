//! Seal / open throughput of 1 MiB frames per suite. `cargo bench -p ferry-channel`.

use divan::counter::BytesCount;
use divan::Bencher;
use ferry_channel::{ChannelReader, ChannelWriter, Frame, Suite};

fn main() {
    divan::main();
}

const N: usize = 1 << 20;

fn suite(name: &str) -> Suite {
    if name == "aes" {
        Suite::Aes256Gcm
    } else {
        Suite::ChaCha20Poly1305
    }
}

#[divan::bench(args = ["aes", "chacha"])]
fn seal(b: Bencher, name: &str) {
    let data = vec![7u8; N];
    let mut w =
        ChannelWriter::with_key(std::io::sink(), suite(name), [1; 32]).expect("32-byte key");
    b.counter(BytesCount::new(N))
        .bench_local(|| w.send_frame(&data).expect("seal"));
}

#[divan::bench(args = ["aes", "chacha"])]
fn open(b: Bencher, name: &str) {
    let data = vec![7u8; N];
    let mut w = ChannelWriter::with_key(Vec::new(), suite(name), [1; 32]).expect("32-byte key");
    for _ in 0..64 {
        w.send_frame(&data).expect("seal");
    }
    let bytes = w.into_inner();
    b.counter(BytesCount::new(N * 64)).bench_local(|| {
        let mut r = ChannelReader::with_key(&bytes[..], suite(name), [1; 32]).expect("32-byte key");
        for _ in 0..64 {
            match r.next_frame().expect("open") {
                Frame::Data(d) => assert_eq!(d.len(), N),
                Frame::End => unreachable!(),
            }
        }
    });
}
