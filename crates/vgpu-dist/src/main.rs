//! `vgpu-dist DIR`: writes the manual pages (`DIR/man/*.1`, one per
//! command and subcommand) and shell completions (`DIR/completions/`:
//! bash, zsh, fish) of `vgpud` and `vgpuctl`, generated from their clap
//! definitions so that they never disagree with `--help`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Command, CommandFactory};
use clap_complete::Shell;

fn write_all(cmd: Command, out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    let name = cmd.get_name().to_string();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd.clone(), &name, &completions)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        eprintln!("usage: vgpu-dist DIR");
        return ExitCode::from(2);
    };
    let out = PathBuf::from(out);
    for cmd in [vgpud::cli::Cli::command(), vgpuctl::cli::Cli::command()] {
        let name = cmd.get_name().to_string();
        if let Err(e) = write_all(cmd, &out) {
            eprintln!("vgpu-dist: {name}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_writes_pages_for_every_subcommand_and_completions() {
        let dir = std::env::temp_dir().join(format!("vgpu-dist-test-{}", std::process::id()));
        write_all(vgpud::cli::Cli::command(), &dir).unwrap();
        let page = std::fs::read_to_string(dir.join("man/vgpud-run.1")).unwrap();
        assert!(page.contains("seccomp"), "the run page documents --seccomp");
        assert!(dir.join("man/vgpud-check-config.1").is_file());
        let bash = std::fs::read_to_string(dir.join("completions/vgpud.bash")).unwrap();
        assert!(
            bash.contains("check-config"),
            "completion knows the subcommands"
        );
        assert!(dir.join("completions/_vgpud").is_file());
        assert!(dir.join("completions/vgpud.fish").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
