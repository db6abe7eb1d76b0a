//! `ferry completions SHELL` and `ferry man [COMMAND]`: shell completions
//! and man pages generated from the same definitions as the parser, so
//! they cannot drift from it.

use std::io::Write;

use clap::Args;

use crate::exit;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for. Install, e.g.: `ferry completions bash >
    /// /etc/bash_completion.d/ferry`, `ferry completions zsh >
    /// ~/.zfunc/_ferry`, `ferry completions fish >
    /// ~/.config/fish/completions/ferry.fish`.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// The page of this command (`ferry-sync(1)`, …); without it,
    /// `ferry(1)`. Install, e.g.: `ferry man > /usr/local/share/man/man1/ferry.1`.
    command: Option<String>,
}

pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> i32 {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "ferry", &mut out);
    emit(&out)
}

pub fn man(a: ManArgs, cmd: clap::Command) -> i32 {
    let (page, title) = match &a.command {
        None => (cmd, "ferry".to_string()),
        Some(name) => match cmd.find_subcommand(name).filter(|c| !c.is_hide_set()) {
            Some(sub) => (sub.clone(), format!("ferry-{name}")),
            None => {
                errln!("ferry man: no command {name:?} (see ferry --help)");
                return exit::USAGE;
            }
        },
    };
    let mut out = Vec::new();
    if let Err(e) = clap_mangen::Man::new(page).title(title).render(&mut out) {
        errln!("ferry man: {e}");
        return exit::IO;
    }
    emit(&out)
}

/// Write `bytes` to stdout; a closed pipe (`| head`) is not an error.
fn emit(bytes: &[u8]) -> i32 {
    let mut o = std::io::stdout().lock();
    match o.write_all(bytes).and_then(|_| o.flush()) {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => {
            errln!("ferry: writing to stdout: {e}");
            exit::IO
        }
    }
}
