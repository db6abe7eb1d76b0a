//! The pre-shared key of `send`/`recv`/`pipe` and of `ferry://` daemons:
//! `--key-file FILE`, else `$FERRY_KEY_FILE`, else `$FERRY_KEY` (the key
//! itself).

use std::path::Path;

use ferry_channel::Psk;

/// The key from `file`, or from the environment.
pub fn read_key(file: Option<&Path>) -> Result<Psk, String> {
    let env_file = std::env::var_os("FERRY_KEY_FILE").map(std::path::PathBuf::from);
    let raw = if let Some(f) = file.or(env_file.as_deref()) {
        std::fs::read(f).map_err(|e| format!("cannot read key file {}: {e}", f.display()))?
    } else if let Ok(k) = std::env::var("FERRY_KEY") {
        k.into_bytes()
    } else {
        return Err(
            "no key: pass --key-file FILE (or set FERRY_KEY_FILE, or FERRY_KEY to the key itself; at least 16 bytes, e.g. 32 hex digits from `ferry keygen`)"
                .into(),
        );
    };
    Psk::new(&raw).map_err(|e| e.to_string())
}
