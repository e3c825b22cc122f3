//! Where each setting in force came from, for `floret config print`: the
//! defaults, the configuration file, a variable named after the setting's
//! path (`FLORET_RAFT__HEARTBEAT_MS`) or one of the named variables
//! (`FLORET_NODE_ID`). Found by loading the configuration with and without
//! each layer and comparing.
//!
//! IMPLEMENTATION CAVEATS
//! - Flags of `floret serve` go over all of these and are not shown.
//! - A layer that sets a setting to its default value shows as that layer
//!   only when it is the file or a path variable (a named variable equal to
//!   what is under it changes nothing, so it is not seen).

use std::collections::BTreeMap;
use std::path::Path;

use super::{Config, ConfigError, NESTED_PREFIX, NESTED_SEPARATOR, read_table};

/// One setting in force: its path, its value (TOML), where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingOrigin {
    /// `raft.heartbeat_ms`.
    pub path: String,
    /// Its value as TOML (`40`, `"floret"`); secrets are `"<redacted>"`.
    pub value: String,
    /// `default`, `file <path>` or the variable's name.
    pub origin: String,
}

impl Config {
    /// Every setting in force once `file`, the path variables in
    /// `variables` and the named variables `env` answers are applied, with
    /// where it came from, in path order.
    pub fn origins(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        variables: Vec<(String, String)>,
    ) -> Result<Vec<SettingOrigin>, ConfigError> {
        let settings = |env: &dyn Fn(&str) -> Option<String>| {
            Self::load_overlaid(file, env, variables.clone()).map(|config| config.settings())
        };
        let in_force = settings(&env)?;
        let under_named = settings(&|_| None)?;
        let mut origin: BTreeMap<String, String> = BTreeMap::new();
        for name in Self::environment_variables() {
            let Some(value) = env(&name) else {
                continue;
            };
            let alone = settings(&|asked| (asked == name).then(|| value.clone()))?;
            for (path, value) in &alone {
                if under_named.get(path) != Some(value) {
                    origin.insert(path.clone(), name.clone());
                }
            }
        }
        for (name, _) in &variables {
            if let Some(path) = name
                .strip_prefix(NESTED_PREFIX)
                .filter(|path| path.contains(NESTED_SEPARATOR))
            {
                let path = path.replace(NESTED_SEPARATOR, ".").to_ascii_lowercase();
                origin.entry(path).or_insert_with(|| name.clone());
            }
        }
        if let Some(file) = file {
            for path in settings_named_in(file)? {
                origin
                    .entry(path)
                    .or_insert_with(|| format!("file {}", file.display()));
            }
        }
        Ok(in_force
            .into_iter()
            .map(|(path, value)| SettingOrigin {
                origin: origin
                    .get(&path)
                    .cloned()
                    .unwrap_or_else(|| "default".to_owned()),
                path,
                value,
            })
            .collect())
    }

    /// Every setting as `(path, TOML value)`; a table's entries are
    /// settings of their own, arrays are one setting.
    fn settings(&self) -> BTreeMap<String, String> {
        let mut settings = BTreeMap::new();
        if let Ok(toml::Value::Table(table)) = toml::Value::try_from(self) {
            flatten("", &table, &mut settings);
        }
        settings
    }
}

/// The settings the file at `path` names, as paths.
fn settings_named_in(path: &Path) -> Result<Vec<String>, ConfigError> {
    let mut named = BTreeMap::new();
    flatten("", &read_table(path)?, &mut named);
    Ok(named.into_keys().collect())
}

fn flatten(prefix: &str, table: &toml::Table, into: &mut BTreeMap<String, String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(inner) => flatten(&path, inner, into),
            other => {
                into.insert(path, other.to_string());
            }
        }
    }
}
