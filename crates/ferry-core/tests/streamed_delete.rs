//! `--delete` during the list, against a sender played by hand (see
//! `hostile_peer`): a sender that announces one walk (`SUBTREES`) has the
//! extras of each directory deleted as soon as the list leaves it, never
//! the work in progress there, never after a source entry could not be
//! read, and a sender that breaks the promise is refused.

mod hostile_peer;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use ferry_link::features::{ALL, SUBTREES};
use ferry_link::Message;
use hostile_peer::*;

/// Wait up to `secs` for `p` to be gone.
fn gone_within(p: &Path, secs: u64) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if fs::symlink_metadata(p).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// The list leaves `a` while `a/big` (a partial file's size) is still to
/// come: `a`'s extra goes before the sender sends a byte, the stale
/// partial file of a name the list lacks goes with it, and the partial
/// file `a/big` is being received into stays, so the file lands.
#[test]
fn an_ended_directory_loses_its_extras_at_once_and_keeps_work_in_progress() {
    let l = Layout::new();
    let a = l.dst.join("a");
    fs::create_dir(&a).unwrap();
    fs::write(a.join("extra"), b"old").unwrap();
    fs::write(a.join(".gone.ferry-partial"), b"stale").unwrap();
    fs::create_dir(l.dst.join("b")).unwrap();
    fs::write(l.dst.join("b/extra"), b"old").unwrap();
    let size = (32 << 20) + 4096;
    let spec = format!("D:;D:a;F:a/big:{size};D:b;F:b/f:10;F:top:3");
    let list = l.list(&spec);
    let (extra, stale) = (a.join("extra"), a.join(".gone.ferry-partial"));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let script: Script = Box::new(move |p| {
        p.features = ALL | SUBTREES;
        p.start(list);
        // Before any data: the list has left a (and b, at `top`).
        let first = p.want();
        let mut s = seen2.lock().unwrap();
        s.push(format!(
            "extra gone before data: {}",
            gone_within(&extra, 10)
        ));
        s.push(format!(
            "stale partial gone before data: {}",
            gone_within(&stale, 1)
        ));
        drop(s);
        if let Some(f) = first {
            p.send_file(f, ferry_link::WantMode::Whole);
        }
        p.serve();
    });
    let o = l.run("streamed", false, true, script);
    let mut fails = Vec::new();
    if !o.succeeded() {
        fails.push(format!("failed: {}", o.shown()));
    }
    for s in seen.lock().unwrap().iter() {
        if s.ends_with("false") {
            fails.push(s.clone());
        }
    }
    let got = fs::read(l.dst.join("a/big")).unwrap_or_default();
    if got != content(2, size) {
        fails.push(format!("a/big: {} bytes, not the file sent", got.len()));
    }
    let left: Vec<String> = names(&a);
    if left != ["big"] {
        fails.push(format!("a holds {left:?}, not just big"));
    }
    if l.dst.join("b/extra").exists() {
        fails.push("b/extra kept".into());
    }
    note(&mut fails, "streamed", Vec::new(), &l, &[]);
    verdict("an_ended_directory_loses_its_extras_at_once", fails);
}

/// A source entry the sender could not read (a directory it could not
/// list) is reported before anything after it: what ended before stays
/// deleted (as rsync's --delete-during), nothing after it is deleted, and
/// the run says deletion was skipped.
#[test]
fn nothing_is_deleted_once_the_sender_could_not_read_an_entry() {
    let l = Layout::new();
    for d in ["a", "b", "c"] {
        fs::create_dir(l.dst.join(d)).unwrap();
        fs::write(l.dst.join(d).join("extra"), b"old").unwrap();
    }
    fs::write(l.dst.join("top-extra"), b"old").unwrap();
    let mut list = l.list("D:;D:a;F:a/f:1;D:b;D:c;F:c/f:1");
    let rest = list.split_off(4); // D:c and c/f: after the report
    let script: Script = Box::new(move |p| {
        p.features = ALL | SUBTREES;
        if !p.hello() {
            return;
        }
        p.list(list);
        // b could not be listed: its copy must survive.
        p.send(Message::FileFailed {
            file: ferry_link::NO_FILE,
            error: "list directory b: Permission denied".into(),
        });
        p.list(rest);
        p.send(Message::EndOfList);
        p.serve();
    });
    let o = l.run("unread", false, true, script);
    let mut fails = Vec::new();
    match &o.res {
        Ok(r) if r.delete_skipped > 0 => {
            if !r
                .errors
                .iter()
                .any(|e| e.contains("skipping deletion from there on"))
            {
                fails.push(format!(
                    "the report does not say from where: {:?}",
                    r.errors
                ));
            }
        }
        other => fails.push(format!("deletion not reported skipped: {other:?}")),
    }
    if l.dst.join("a/extra").exists() {
        fails.push("a/extra kept: a ended before the report".into());
    }
    for kept in ["b/extra", "c/extra", "top-extra"] {
        if !l.dst.join(kept).exists() {
            fails.push(format!("{kept} DELETED after the report"));
        }
    }
    note(&mut fails, "unread", Vec::new(), &l, &[]);
    verdict(
        "nothing_is_deleted_once_the_sender_could_not_read_an_entry",
        fails,
    );
}

/// A sender that announced one walk and then lists an entry in a
/// directory the list has left, or a directory again, is refused; without
/// the promise the same lists are fine (several sources merge).
#[test]
fn a_broken_promise_of_one_walk_is_a_protocol_error() {
    let mut fails = Vec::new();
    for spec in [
        "D:;D:a;F:a/x:1;D:b;F:a/y:1",
        "D:;D:a;D:a/s;D:b;D:a/s/t",
        "D:;D:a;D:b;D:a",
        "D:;D:a;F:a/x:1;D:a;F:a/y:1",
    ] {
        for features in [ALL | SUBTREES, ALL] {
            let l = Layout::new();
            let list = l.list(spec);
            let script: Script = Box::new(move |p| {
                p.features = features;
                p.start(list);
                p.serve();
            });
            let label = format!("{spec} promised={}", features & SUBTREES != 0);
            let o = l.run(&label, false, true, script);
            let p = match features & SUBTREES != 0 {
                true => o.refused(),
                false => match o.succeeded() {
                    true => Vec::new(),
                    false => vec![format!("failed without the promise: {}", o.shown())],
                },
            };
            note(&mut fails, &label, p, &l, &[]);
        }
    }
    verdict("a_broken_promise_of_one_walk_is_a_protocol_error", fails);
}
