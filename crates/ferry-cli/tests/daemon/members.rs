//! `ferry://host/ARCHIVE#MEMBER`: a member of a tar archive beneath the
//! daemon's root is pulled in place; an archive reached through a symlink
//! (to one outside the root, or on the way through a linked directory) is
//! not.

use super::*;

fn tar(dir: &Path, archive: &Path, members: &[&str]) {
    let ok = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["--format=ustar", "-cf"])
        .arg(archive)
        .args(members)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "tar -cf {}", archive.display());
}

#[test]
fn members_are_pulled_from_archives_beneath_the_root_only() {
    if !need(
        "tar",
        "members_are_pulled_from_archives_beneath_the_root_only",
    ) {
        return;
    }
    let (t, _src, root, key) = fixture();
    let (inside, outside) = (t.path().join("in"), t.path().join("outside"));
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(inside.join("disk.img"), bytes(21, 1 << 20)).unwrap();
    std::fs::write(inside.join("vm.ovf"), b"<Envelope/>").unwrap();
    tar(&inside, &root.join("vm.ova"), &["vm.ovf", "disk.img"]);
    std::fs::write(inside.join("secret.img"), b"outside the root\n").unwrap();
    tar(&inside, &outside.join("secret.ova"), &["secret.img"]);
    std::os::unix::fs::symlink(outside.join("secret.ova"), root.join("evil.ova")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let d = Daemon::start(&key, &["--root", p(&root)]);

    let got = t.path().join("got.img");
    let o = pull(&d, "vm.ova#disk.img", &got, p(&key));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(std::fs::read(&got).unwrap() == std::fs::read(inside.join("disk.img")).unwrap());

    for path in [
        "evil.ova#secret.img",
        "link/secret.ova#secret.img",
        "vm.ova#../secret.img",
        "nope.ova#disk.img",
    ] {
        let out = t.path().join("refused.img");
        let o = pull(&d, path, &out, p(&key));
        assert_ne!(code(&o), 0, "{path}: {}", stderr(&o));
        assert!(!out.exists(), "{path}: something was written");
        assert!(!stderr(&o).contains("outside the root"), "{path}");
    }
}
