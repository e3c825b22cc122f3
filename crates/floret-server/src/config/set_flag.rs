//! `floret serve --set path=value`: any setting by its path
//! (`raft.election_timeout_min_ms=300`, `metrics_top_producers=20`), with
//! the value written as in the file or a variable (human units included).
//! These go over the file and the variables; `serve`'s named flags
//! (`--node-id`...) go over them.

use super::{Config, ConfigError, set_nested, toml_value};

impl Config {
    /// This configuration with every `path=value` of `settings` over it.
    pub fn with_settings(self, settings: &[String]) -> Result<Self, ConfigError> {
        if settings.is_empty() {
            return Ok(self);
        }
        let refused = |setting: &str, message: String| ConfigError::SetFlag {
            setting: setting.to_owned(),
            message,
        };
        let secret = self.gossip.secret.clone();
        let mut table = match toml::Value::try_from(&self) {
            Ok(toml::Value::Table(table)) => table,
            _ => {
                return Err(refused(
                    &settings.join(" "),
                    "the configuration cannot be written as TOML".into(),
                ));
            }
        };
        let mut sets_the_secret = false;
        for setting in settings {
            let (path, value) = setting
                .split_once('=')
                .ok_or_else(|| refused(setting, "write it as path=value".into()))?;
            let keys: Vec<String> = path.trim().split('.').map(str::to_owned).collect();
            sets_the_secret |= path.trim() == "gossip.secret";
            set_nested(&mut table, &keys, toml_value(value.trim()))
                .map_err(|message| refused(setting, message))?;
        }
        let mut config: Config = toml::Value::Table(table).try_into().map_err(|error| {
            refused(
                &settings.join(" "),
                error.to_string().trim_end().replace('\n', " "),
            )
        })?;
        if !sets_the_secret {
            config.gossip.secret = secret;
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretText;

    #[test]
    fn a_setting_without_a_flag_could_not_be_given_on_the_command_line() {
        let mut base = Config::default();
        base.gossip.secret = Some(SecretText("kept-secret-of-at-least-32-bytes!".into()));
        let config = base
            .with_settings(&[
                "raft.election_timeout_min_ms=300".into(),
                "metrics_top_producers = 25".into(),
                "shutdown.drain_timeout_ms=45s".into(),
            ])
            .unwrap();
        assert_eq!(config.raft.election_timeout_min_ms, 300);
        assert_eq!(config.metrics_top_producers, 25);
        assert_eq!(config.shutdown.drain_timeout_ms, 45_000);
        assert_eq!(
            config
                .gossip
                .secret
                .as_ref()
                .map(|secret| secret.0.as_str()),
            Some("kept-secret-of-at-least-32-bytes!"),
            "a round trip through TOML must not lose the redacted secret"
        );
    }

    #[test]
    fn a_mistyped_set_flag_was_ignored() {
        for (setting, says) in [
            ("raft.no_such_setting=1", "no_such_setting"),
            ("raft.heartbeat_ms=soon", "heartbeat_ms"),
            ("raft", "path=value"),
        ] {
            let error = Config::default()
                .with_settings(&[setting.to_owned()])
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("--set") && error.contains(says),
                "{setting}: {error}"
            );
        }
    }
}
