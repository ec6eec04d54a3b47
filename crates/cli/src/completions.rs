//! `tender completions SHELL`: shell completion scripts, generated from the command
//! definition so they never fall behind it. The caller hands in that definition (`app` owns
//! it), so this module does not reach back into `app`.

use std::io::Write;

use anyhow::Result;
use clap_complete::Shell;

/// Arguments of `tender completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Writes the completion script of `cmd` (the whole command line, named `bin_name`) for
/// `args.shell` to `out`.
pub fn run(args: &Args, mut cmd: clap::Command, bin_name: &str, out: &mut dyn Write) -> Result<()> {
    clap_complete::generate(args.shell, &mut cmd, bin_name.to_string(), out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(shell: Shell) -> String {
        let mut out = Vec::new();
        let cmd = crate::app::command_for(None);
        run(&Args { shell }, cmd, crate::app::BIN_NAME, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn bash_zsh_and_fish_scripts_complete_the_subcommands() {
        let bash = script(Shell::Bash);
        assert!(bash.contains("complete -F _tender"), "{bash}");
        let zsh = script(Shell::Zsh);
        assert!(zsh.starts_with("#compdef tender"), "{zsh}");
        let fish = script(Shell::Fish);
        assert!(fish.contains("complete -c tender"), "{fish}");
        for s in [&bash, &zsh, &fish] {
            for sub in ["status", "cluster", "rollout", "completions"] {
                assert!(s.contains(sub), "{sub} missing");
            }
        }
        assert!(
            fish.contains("json") && fish.contains("yaml"),
            "-o values complete"
        );
    }
}
