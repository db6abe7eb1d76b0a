//! Writes the seed corpus: `corpus/<target>/<name>` for every seed of
//! `ferry_fuzz::seeds::all()`, replacing what each target's directory
//! held. Run from anywhere: `cargo run --manifest-path fuzz/Cargo.toml
//! --example gen_corpus`.

use std::fs;
use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (t, _) in ferry_fuzz::TARGETS {
        let d = root.join(t);
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("corpus directory");
    }
    let mut total = 0;
    for (t, name, bytes) in ferry_fuzz::seeds::all() {
        assert!(
            ferry_fuzz::target(t).is_some(),
            "seed for unknown target {t}"
        );
        total += bytes.len();
        fs::write(root.join(t).join(&name), &bytes).expect("seed");
    }
    for (t, _) in ferry_fuzz::TARGETS {
        let n = fs::read_dir(root.join(t)).map(|r| r.count()).unwrap_or(0);
        println!("{t:20} {n:3} seeds");
    }
    println!("{total} bytes in all");
}
