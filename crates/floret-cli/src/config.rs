//! `floret config print`: the configuration a node started here would use
//! (defaults, `--config` file and `FLORET_*` variables, as `floret serve`
//! reads them), one setting per line in TOML with where it came from.
//! Secrets are redacted.
//!
//! IMPLEMENTATION CAVEATS
//! - `floret serve`'s own flags go over these and are not shown.

use std::path::PathBuf;

use floret_server::config::Config;

#[derive(clap::Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(clap::Subcommand)]
enum ConfigCommand {
    /// Print every setting in force, with where it came from.
    Print {
        /// The configuration file `floret serve --config` would read.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let ConfigCommand::Print { config } = args.command;
    let origins = Config::origins(
        config.as_deref(),
        |name| std::env::var(name).ok(),
        crate::environment().collect(),
    )?;
    let width = origins
        .iter()
        .map(|setting| setting.path.len() + setting.value.len() + 3)
        .max()
        .unwrap_or(0);
    for setting in origins {
        let line = format!("{} = {}", setting.path, setting.value);
        println!("{line:<width$}  # {}", setting.origin);
    }
    Ok(())
}
