//! Print what `--sparsify` would make of an image: `cargo run -p
//! ferry-guest --example guestmap -- IMAGE [--force]`.

use std::os::unix::fs::FileExt;

struct F(std::fs::File, u64);

impl ferry_guest::ReadAt for F {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.0.read_exact_at(buf, off)
    }
    fn size(&self) -> u64 {
        self.1
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: guestmap IMAGE [--force]");
        std::process::exit(2);
    };
    let force = args.iter().any(|a| a == "--force");
    let f = std::fs::File::open(path).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(1)
    });
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let t = std::time::Instant::now();
    if args.iter().any(|a| a == "--debug") {
        let img = F(f.try_clone().unwrap(), size);
        eprintln!(
            "ext4: {:?}",
            ferry_guest::ext4::free_ranges(&img).map(|m| m.kind)
        );
        eprintln!(
            "xfs: {:?}",
            ferry_guest::xfs::free_ranges(&img).map(|m| m.kind)
        );
        eprintln!(
            "swap: {:?}",
            ferry_guest::swap::free_ranges(&img).map(|m| m.kind)
        );
        eprintln!("table: {:?}", ferry_guest::part::read_table(&img));
    }
    match ferry_guest::map_image(&F(f, size), &ferry_guest::MapOptions { force }) {
        Ok(m) => {
            println!("scheme {}", m.scheme);
            for l in m.summary_lines() {
                println!("{l}");
            }
            println!(
                "free {} of {} bytes in {} ranges, mapped in {:?}",
                m.free.total(),
                size,
                m.free.as_slice().len(),
                t.elapsed()
            );
        }
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    }
}
