//! `ferry serve --stdio`: the remote side of a sync, started by ssh. It
//! speaks the protocol on stdin/stdout and never prints to stdout; errors
//! travel to the other side in the protocol (and to stderr, which ssh
//! passes back). `ferry serve --listen` is the daemon ([`crate::daemon_cmd`]),
//! whose clients send the same command line as their request.

use clap::Args;

use crate::engine_args::EngineArgs;
use crate::exit;
use crate::sync_cmd::class_code;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Speak the protocol on stdin and stdout (started by ssh).
    #[arg(long, required_unless_present = "listen")]
    stdio: bool,
    /// Be the sender: PATHS are the sources.
    #[arg(long, conflicts_with = "receive")]
    send: bool,
    /// Be the receiver: PATHS is the destination.
    #[arg(long)]
    receive: bool,
    /// The destination is a file if the one source is a file.
    #[arg(long)]
    file_or_dir: bool,
    /// Carry the data over a direct, encrypted TCP connection.
    #[arg(long)]
    direct: bool,
    #[command(flatten)]
    pub daemon: crate::daemon_cmd::DaemonArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[arg(last = true, required_unless_present = "listen")]
    paths: Vec<String>,
}

impl ServeArgs {
    /// What a `serve` command line asks for (a daemon client's request).
    pub fn request(&self) -> Result<ferry_core::remote::daemon::Request, String> {
        if self.send == self.receive {
            return Err("--send or --receive is required".into());
        }
        Ok(ferry_core::remote::daemon::Request {
            send: self.send,
            file_or_dir: self.file_or_dir,
            paths: self.paths.clone(),
            opts: self.engine.options()?,
            stream: false,
        })
    }
}

pub fn run(a: ServeArgs) -> i32 {
    if a.daemon.listen.is_some() {
        return match a.engine.options() {
            Ok(o) => crate::daemon_cmd::run(&a.daemon, o.timeout, o.partial_dir),
            Err(e) => {
                errln!("ferry serve: {e}");
                exit::USAGE
            }
        };
    }
    if !a.send && !a.receive {
        errln!("ferry serve: --send or --receive is required");
        return exit::USAGE;
    }
    let opts = match a.engine.options() {
        Ok(o) => o,
        Err(e) => {
            errln!("ferry serve: {e}");
            return exit::USAGE;
        }
    };
    match ferry_core::remote::serve_stdio(a.send, a.file_or_dir, a.direct, &a.paths, &opts) {
        Ok(()) => exit::OK,
        Err(e) => {
            // The peer has been told over the protocol when it could be;
            // this line reaches the user through ssh's stderr otherwise.
            errln!("ferry serve: {e}");
            class_code(e.class())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: super::ServeArgs,
    }

    /// What the client writes, the server parses.
    #[test]
    fn serve_args_roundtrip() {
        let opts = ferry_core::SyncOptions {
            delete: true,
            checksum: true,
            delta: ferry_core::DeltaMode::Delta,
            excludes: ferry_core::Excludes::from_rules(&[
                ferry_core::FilterRule::exclude("*.tmp"),
                ferry_core::FilterRule::include("--odd"),
                ferry_core::FilterRule::exclude("* x "),
            ])
            .unwrap(),
            delete_excluded: true,
            max_delete: Some(7),
            acls: true,
            backup: Some(".bak".into()),
            link_dest: vec!["../snap 1".into()],
            chmod: ferry_core::chmod::Chmod::parse(&["D755,F644".into(), "u+X".into()]).unwrap(),
            skip: ferry_core::SkipRules {
                update: true,
                ignore_existing: true,
                min_size: Some(3),
                max_size: Some(4 << 20),
            },
            sig_cache: Some("/var/cache/x y".into()),
            bwlimit: Some(2_000_123),
            ..Default::default()
        };
        let args = ferry_core::remote::serve_args(&opts, false, true, &["/dst dir".into()]);
        use clap::{CommandFactory, FromArgMatches};
        let m = Wrap::command()
            .try_get_matches_from(std::iter::once("x".to_string()).chain(args.into_iter().skip(1)))
            .unwrap();
        let mut w = Wrap::from_arg_matches(&m).unwrap();
        w.a.engine.order_rules(&m);
        let got = w.a.engine.options().unwrap();
        assert_eq!(got.excludes.rules(), opts.excludes.rules());
        assert!(got.delete_excluded && got.max_delete == Some(7) && got.acls);
        assert_eq!(got.skip, opts.skip);
        assert_eq!(got.backup, opts.backup);
        assert_eq!(got.chmod, opts.chmod);
        assert_eq!(got.link_dest, opts.link_dest);
        assert!(
            w.a.receive
                && w.a.file_or_dir
                && w.a.engine.delete
                && w.a.engine.checksum
                && w.a.engine.delta
        );
        assert_eq!(w.a.paths, vec!["/dst dir".to_string()]);
        assert_eq!(
            w.a.engine.sig_cache.unwrap(),
            std::path::PathBuf::from("/var/cache/x y")
        );
        // Bytes per second, whatever units a user would type.
        assert_eq!(w.a.engine.bwlimit, Some(2_000_123));
    }
}
