//! Seeds of `guest_image`: real images and archives (made by mkfs.ext4,
//! mkfs.ext2, mkfs.xfs with its log zeroed, mkswap, sgdisk, sfdisk and GNU
//! tar), kept in `seeds-data/guest_image/` in the target's sparse-record
//! form by `seeds-data/guest_image.py`.

use std::fs;
use std::path::Path;

use super::Seed;

pub fn guest_image(v: &mut Vec<Seed>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds-data/guest_image");
    let mut names: Vec<_> = fs::read_dir(&dir)
        .expect("fuzz/seeds-data/guest_image")
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    for p in names {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        v.push(("guest_image", name, fs::read(&p).expect("a seed image")));
    }
}
