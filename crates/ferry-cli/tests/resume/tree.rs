//! A tree of many small files interrupted half way: no journal is kept
//! for small files (the incremental pass is their resume), and the next
//! run sends only the files that had not arrived.

use super::*;

const FILES: usize = 4000;
const FILE_SIZE: usize = 16 << 10;

#[test]
fn a_tree_of_small_files_killed_half_way_sends_only_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    for i in 0..FILES {
        let dir = src.join(format!("d{:02}", i % 40));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("f{i}")), bytes(i as u64 + 1, FILE_SIZE)).unwrap();
    }
    let dst = d.path().join("dst");
    let total = (FILES * FILE_SIZE) as u64;
    // 16 MiB/s: about 4 s for the 62.5 MiB; killed once about half the
    // files are in place.
    let start = Instant::now();
    let child = Command::new(ferry_bin())
        .args(["sync", "-q", "--bwlimit", "16M", &slash(&src), p(&dst)])
        .spawn()
        .unwrap();
    let count = |root: &Path| -> (usize, Vec<String>) {
        let (mut n, mut odd) = (0, Vec::new());
        for sub in fs::read_dir(root).into_iter().flatten().flatten() {
            for e in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('f') {
                    n += 1;
                } else {
                    odd.push(name);
                }
            }
        }
        (n, odd)
    };
    while count(&dst).0 < FILES / 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the copy does not progress"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    procs::signal(child.id() as i32, "-KILL");
    let r = finish(child, start, Duration::from_secs(30), "kill");
    r.no_panic();
    let (before, _) = count(&dst);
    assert!(before < FILES, "the copy finished before the kill");
    let names: Vec<String> = walk_names(&dst);
    assert!(
        !names
            .iter()
            .any(|n| n.contains("ferry-journal") || n.contains("ferry-partial")),
        "no journal or partial file for small files: {names:?}"
    );
    // The re-run: only the files that were missing move.
    let again = run(Command::new(ferry_bin()).args(["sync", "--json", &slash(&src), p(&dst)]));
    assert_eq!(again.code, Some(0), "{}", again.err);
    let moved = again.n("files_transferred") as usize;
    let written = again.n("bytes_written");
    say!(
        "tree: {before} of {FILES} files in place at the kill; the re-run moved {moved} ({} KiB)",
        written >> 10
    );
    // A file being renamed into place at the kill may be counted either way.
    assert!(
        moved <= FILES - before + 8 && moved + before >= FILES,
        "moved {moved} with {before} of {FILES} already there"
    );
    assert!(
        written <= total - (before as u64 - 8) * FILE_SIZE as u64,
        "{}",
        again.json
    );
    assert_same_tree(&src, &dst);
    let (_, odd) = count(&dst);
    assert!(odd.is_empty(), "left behind: {odd:?}");
}

/// Every name under `root`.
fn walk_names(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).into_iter().flatten().flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk_names(&e.path()));
        }
    }
    out
}
