//! Fuzz the frame decoder with untrusted bodies: it must never panic (nor
//! allocate beyond the body), and whatever it accepts must re-encode to a
//! body that decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    if let Ok(m) = ferry_proto::decode(body) {
        let mut again = Vec::new();
        ferry_proto::encode(&m, &mut again);
        let m2 = ferry_proto::decode(&again).expect("re-encoded message decodes");
        assert_eq!(m, m2);
    }
});
