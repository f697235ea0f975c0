//! `busway config`: check a node configuration file without starting a node, or print the
//! commented example (`docs/busway.toml`, every key at its default).

use clap::Subcommand;
use std::process::ExitCode;

/// The commented example file.
const EXAMPLE: &str = include_str!("../../../docs/busway.toml");

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigCmd {
    /// Read FILE as `busway node -c FILE` would and say what is wrong (the key, its line and
    /// what is allowed), or that it is fine; exit code 1 if it is not.
    Check {
        /// The TOML file.
        file: std::path::PathBuf,
    },
    /// Print a commented configuration file with every setting at its default.
    Example,
}

pub(crate) fn run(cmd: ConfigCmd) -> Result<ExitCode, String> {
    match cmd {
        ConfigCmd::Example => {
            print!("{EXAMPLE}");
            Ok(ExitCode::SUCCESS)
        }
        ConfigCmd::Check { file } => {
            let c = busway::NodeConfig::from_toml_file(&file)?;
            // `node -c FILE` refuses a file without one unless `--id` gives it.
            if c.id == busway::BusId(0) {
                return Err(format!(
                    "{}: no bus id: add `id = N` to the file, or give it when the node starts \
                     (`busway node -c {} --id N`)",
                    file.display(),
                    file.display()
                ));
            }
            let listen: Vec<String> = c.listen.iter().map(ToString::to_string).collect();
            println!(
                "{}: ok (bus id {}, listening on [{}], {} connect address(es), upstream {})",
                file.display(),
                c.id,
                listen.join(", "),
                c.connect.len(),
                c.upstream
                    .as_ref()
                    .map_or("none".to_owned(), ToString::to_string)
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
