//! The committed corpus as a regression test on stable: every file of
//! `corpus/<target>/` (and of `artifacts-found/<target>/`, the reproducers
//! of bugs found and fixed) goes through its target, as do the seeds the
//! generator makes now. A panic on any thread fails the test: the engine
//! joins some worker threads itself, so a panic hook records them.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

static PANICKED: AtomicBool = AtomicBool::new(false);

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn replay(label: &str, f: fn(&[u8]), data: &[u8]) {
    let r = std::panic::catch_unwind(|| f(data));
    assert!(
        r.is_ok() && !PANICKED.swap(false, Ordering::SeqCst),
        "{label} panicked"
    );
}

#[test]
fn corpus_and_seeds_replay_without_a_failure() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICKED.store(true, Ordering::SeqCst);
        prev(info);
    }));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut total = 0;
    for (t, f) in ferry_fuzz::TARGETS {
        let corpus = files(&root.join("corpus").join(t));
        assert!(!corpus.is_empty(), "no corpus for target {t}");
        for p in corpus
            .iter()
            .chain(&files(&root.join("artifacts-found").join(t)))
        {
            let data = fs::read(p).expect("corpus file");
            total += data.len();
            replay(&p.display().to_string(), *f, &data);
        }
    }
    assert!(total < 1 << 20, "the committed corpus is {total} bytes");
    for (t, name, data) in ferry_fuzz::seeds::all() {
        let f = ferry_fuzz::target(t).expect("a known target");
        replay(&format!("generated seed {t}/{name}"), f, &data);
    }
}
