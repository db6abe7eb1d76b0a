//! The signature cache decoder on arbitrary bytes: it must never panic, and
//! whatever it accepts must encode back to the same bytes and make a
//! consistent signature.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((key, sig, full)) = ferry_delta::cache::decode(data) {
        assert!(sig.is_consistent());
        let again = ferry_delta::cache::encode(&key, &sig, &full).expect("re-encode");
        assert_eq!(again, data);
    }
});
