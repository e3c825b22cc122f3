//! `floret token`: make the key pair tokens are signed with, and sign a
//! tenant's token offline with its private key. Nodes verify tokens with
//! the public key alone (`--token-keys`).

use std::path::PathBuf;

use anyhow::Context;
use floret_server::auth::{Role, SigningKey, TokenClaims};

#[derive(clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Make a signing key pair: token.key (keep it with whoever issues
    /// tokens) and token.pub (every node's --token-keys).
    Keygen {
        /// Folder to write them into (created if missing; files are never overwritten).
        #[arg(long, default_value = "floret-certs")]
        out: PathBuf,
    },
    /// Sign a token for a tenant and print it.
    Create(CreateArgs),
}

#[derive(clap::Args)]
struct CreateArgs {
    /// The private key to sign with (token.key).
    #[arg(long, default_value = "floret-certs/token.key")]
    key: PathBuf,
    /// The tenant: 1 to 64 ASCII letters, digits, '_' or '-'.
    #[arg(long)]
    tenant: String,
    /// What it may do: produce, consume, admin (comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    roles: Vec<Role>,
    /// The queues it may use, as patterns where `*` matches anything
    /// (comma-separated; admin tokens may use every queue without).
    #[arg(long, value_delimiter = ',')]
    queues: Vec<String>,
    /// How long it stays valid: a number with s, m, h or d (`30d`).
    #[arg(long, default_value = "30d")]
    ttl: String,
}

pub fn run(args: TokenArgs) -> anyhow::Result<()> {
    match args.command {
        TokenCommand::Keygen { out } => {
            let key = SigningKey::generate().map_err(anyhow::Error::msg)?;
            crate::certs::write_token_keys(&out, &key)?;
            println!(
                "wrote {0}/token.key (signs tokens: `floret token create --key`) and {0}/token.pub (every node's --token-keys); key id {1}",
                out.display(),
                key.id()
            );
            Ok(())
        }
        TokenCommand::Create(create) => {
            println!("{}", create_token(&create, unix_now())?);
            Ok(())
        }
    }
}

fn create_token(args: &CreateArgs, now_unix_s: u64) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&args.key)
        .with_context(|| format!("cannot read {}", args.key.display()))?;
    let key = SigningKey::from_pem(&text)
        .map_err(|why| anyhow::anyhow!("{}: {why}", args.key.display()))?;
    let ttl = parse_ttl(&args.ttl)?;
    anyhow::ensure!(
        !args.queues.is_empty() || args.roles.contains(&Role::Admin),
        "--queues is needed: a tenant without admin may use only the queues its token names"
    );
    key.sign(&TokenClaims {
        tenant: args.tenant.clone(),
        roles: args.roles.clone(),
        queues: args.queues.clone(),
        exp: now_unix_s.saturating_add(ttl),
        iat: now_unix_s,
    })
    .map_err(anyhow::Error::msg)
}

/// `30d`, `12h`, `45m`, `90s` in seconds.
fn parse_ttl(ttl: &str) -> anyhow::Result<u64> {
    let bad = || anyhow::anyhow!("--ttl {ttl:?}: give a number with s, m, h or d, like 30d");
    let (split, _) = ttl.char_indices().last().ok_or_else(bad)?;
    let (number, unit) = ttl.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    anyhow::ensure!(number > 0, "--ttl must be more than 0");
    number.checked_mul(seconds).ok_or_else(bad)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use floret_server::auth::{TokenVerifier, VerifyKey};

    #[test]
    fn ttls_read_as_people_write_them() {
        assert_eq!(parse_ttl("30d").unwrap(), 30 * 86_400);
        assert_eq!(parse_ttl("90s").unwrap(), 90);
        assert_eq!(parse_ttl("12h").unwrap(), 12 * 3_600);
        for bad in [
            "",
            "d",
            "30",
            "30w",
            "0d",
            "-1d",
            "5\u{b5}",
            "99999999999999999999d",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_created_token_verifies_against_the_public_key_keygen_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let key = SigningKey::generate().unwrap();
        crate::certs::write_token_keys(dir.path(), &key).unwrap();
        let args = CreateArgs {
            key: dir.path().join("token.key"),
            tenant: "acme".into(),
            roles: vec![Role::Produce],
            queues: vec!["orders*".into()],
            ttl: "1h".into(),
        };
        let token = create_token(&args, 1_000).unwrap();
        let public = std::fs::read_to_string(dir.path().join("token.pub")).unwrap();
        let verifier = TokenVerifier::new(vec![VerifyKey::from_pem(&public).unwrap()]);
        let claims = verifier.verify(&token, 2_000).unwrap();
        assert_eq!(claims.tenant, "acme");
        assert_eq!(claims.exp, 1_000 + 3_600);
        let no_queues = CreateArgs {
            queues: Vec::new(),
            ..args
        };
        assert!(create_token(&no_queues, 1_000).is_err());
    }
}
