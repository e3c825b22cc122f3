//! Why a configuration cannot be used.

use std::path::PathBuf;

/// A configuration that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The TOML file is not valid.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        message: String,
    },
    /// An environment variable does not parse.
    #[error("environment variable {name}={value} is not valid: {message}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it does not parse.
        message: String,
    },
    /// A nested variable (`FLORET_SECTION__KEY`) names no setting or
    /// does not fit it.
    #[error("environment variable {name}: {message}")]
    Nested {
        /// The variable (or the variables, when which is unclear).
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A `--set path=value` names no setting or does not fit it.
    #[error("--set {setting}: {message}")]
    SetFlag {
        /// The `path=value` given.
        setting: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}
