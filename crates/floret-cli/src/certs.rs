//! `floret certs`: a CA and the certificates a cluster needs, for
//! development, tests, compose and Kubernetes. Every node gets a member
//! certificate naming `node-<id>.floret` (what its peers expect), plus
//! `localhost`, `127.0.0.1`, `::1` and the `--name`s (what clients dial),
//! usable as both server and client; a client certificate is made too (and
//! one per `--tenant`, carrying `<tenant>.tenant.floret` for nodes'
//! `auth.client_certificates` to map to that tenant), and
//! the cluster's gossip secret (`gossip.key`, 32 random bytes in hex), and
//! the key pair tenants' tokens are signed with (`token.key`, kept by
//! whoever issues tokens; `token.pub`, every node's `--token-keys`).
//!
//! Given a folder that already holds a CA it made (`ca.pem` and `ca.key`),
//! it makes only the node and tenant certificates asked for that the
//! folder does not hold yet, signed by that CA: how a node added to a
//! running cluster gets its certificate.
//!
//! IMPLEMENTATION CAVEATS
//! - It never overwrites files: a certificate that exists is not renewed.
//! - It reuses only a CA it made itself (it rebuilds the CA's name, not
//!   the name of another CA's certificate).
//! - No revocation lists.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use floret_server::auth::SigningKey;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

#[derive(clap::Args)]
pub struct CertsArgs {
    /// Folder to write the certificates into (created if missing; existing
    /// files are never overwritten). When it holds a CA this command made
    /// (ca.pem and ca.key), only the --nodes and --tenant certificates it
    /// does not hold yet are made, signed by that CA: `--nodes 4` adds
    /// node 4's to the certificates of nodes 1 to 3.
    #[arg(long, default_value = "floret-certs")]
    out: PathBuf,
    /// The nodes to make member certificates for: a count (`3` for nodes 1
    /// to 3) or a list of ids (`1,2,5`).
    #[arg(long, default_value = "3")]
    nodes: String,
    /// Another name (DNS name or IP address) every node certificate carries,
    /// for clients that dial the nodes by it; `{id}` is replaced by the
    /// node's id (`--name 'floret-{id}.floret'`). Repeat or separate by commas.
    #[arg(long = "name", value_delimiter = ',')]
    names: Vec<String>,
    /// A tenant to make a client certificate for (`tenant-<name>.pem` and
    /// `.key`, carrying the DNS name `<name>.tenant.floret`, which the
    /// nodes' `auth.client_certificates` map to the tenant). Repeat or
    /// separate by commas.
    #[arg(long = "tenant", value_delimiter = ',')]
    tenants: Vec<String>,
    /// Days the certificates stay valid.
    #[arg(long, default_value_t = 365)]
    days: u32,
}

/// One file to write: its name, contents, and whether it is a secret.
struct PemFile {
    name: String,
    contents: String,
    secret: bool,
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    let nodes = parse_nodes(&args.nodes)?;
    anyhow::ensure!(args.days > 0, "--days must be at least 1");
    for tenant in &args.tenants {
        floret_server::auth::TenantName::parse(tenant)
            .map_err(|why| anyhow::anyhow!("--tenant {tenant:?}: {why}"))?;
    }
    let reusing_ca = args.out.join("ca.key").exists();
    let written = write(&args.out, &nodes, &args.names, &args.tenants, args.days)?;
    if reusing_ca {
        println!(
            "wrote {written} files to {}, signed by the CA already there: node-<id>.pem and .key (--tls-cert and --tls-key of each node), tenant-<name>.pem and .key for each --tenant",
            args.out.display()
        );
        return Ok(());
    }
    println!(
        "wrote {written} files to {}: ca.pem (give it to clients and nodes as --tls-ca / FLORET_TLS_CA), ca.key (keep it offline), node-<id>.pem and .key (--tls-cert and --tls-key of each node), gossip.key (every node's --gossip-secret-file), client.pem and client.key, tenant-<name>.pem and .key for each --tenant (map <name>.tenant.floret in the nodes' auth.client_certificates), token.key (signs tenants' tokens: `floret token create`; keep it offline) and token.pub (every node's --token-keys)",
        args.out.display()
    );
    Ok(())
}

/// Makes the certificates of `nodes` (with the extra `names`, valid for
/// `days`) and writes them into `out`; returns how many files it wrote.
pub fn write(
    out: &Path,
    nodes: &[u64],
    names: &[String],
    tenants: &[String],
    days: u32,
) -> anyhow::Result<usize> {
    let ca_key = out.join("ca.key");
    let now = OffsetDateTime::now_utc();
    let files = if ca_key.exists() && out.join("ca.pem").exists() {
        let key = std::fs::read_to_string(&ca_key)
            .with_context(|| format!("cannot read {}", ca_key.display()))?;
        let key = KeyPair::from_pem(&key)
            .with_context(|| format!("{} holds no private key", ca_key.display()))?;
        let issuer = Issuer::new(ca_params(days, now), key);
        let missing_nodes: Vec<u64> = nodes
            .iter()
            .copied()
            .filter(|node| !out.join(format!("node-{node}.pem")).exists())
            .collect();
        let missing_tenants: Vec<String> = tenants
            .iter()
            .filter(|tenant| !out.join(format!("tenant-{tenant}.pem")).exists())
            .cloned()
            .collect();
        let mut files = Vec::new();
        leaves(
            &issuer,
            &missing_nodes,
            names,
            &missing_tenants,
            days,
            now,
            &mut files,
        )?;
        files
    } else {
        make(nodes, names, tenants, days, now)?
    };
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for file in &files {
        write_new(&out.join(&file.name), &file.contents, file.secret)?;
    }
    Ok(files.len())
}

/// `3` means nodes 1 to 3; `1,2,5` those ids.
fn parse_nodes(nodes: &str) -> anyhow::Result<Vec<u64>> {
    let ids: Vec<u64> = if nodes.contains(',') {
        nodes
            .split(',')
            .map(|id| id.trim().parse::<u64>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("--nodes {nodes:?}: not a list of node ids"))?
    } else {
        let count: u64 = nodes
            .trim()
            .parse()
            .with_context(|| format!("--nodes {nodes:?}: not a count of nodes"))?;
        (1..=count).collect()
    };
    anyhow::ensure!(
        !ids.is_empty() && !ids.contains(&0),
        "--nodes: node ids start at 1"
    );
    Ok(ids)
}

/// The CA's certificate parameters: its name, its constraints, valid for
/// `days` from `now` (what a reused CA is rebuilt from, with its key).
fn ca_params(days: u32, now: OffsetDateTime) -> CertificateParams {
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "floret cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca, days, now);
    ca
}

fn validity(params: &mut CertificateParams, days: u32, now: OffsetDateTime) {
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(i64::from(days));
}

/// The CA, a member certificate per node and a client certificate, valid
/// for `days` from `now`.
fn make(
    nodes: &[u64],
    names: &[String],
    tenants: &[String],
    days: u32,
    now: OffsetDateTime,
) -> anyhow::Result<Vec<PemFile>> {
    let ca_key = KeyPair::generate()?;
    let ca = ca_params(days, now);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let mut files = vec![
        PemFile {
            name: "ca.pem".into(),
            contents: ca_cert.pem(),
            secret: false,
        },
        PemFile {
            name: "ca.key".into(),
            contents: issuer.key().serialize_pem(),
            secret: true,
        },
    ];
    leaves(&issuer, nodes, names, &[], days, now, &mut files)?;
    leaf(
        &issuer,
        ("client".into(), "floret client".into()),
        vec!["client.floret".into()],
        false,
        (days, now),
        &mut files,
    )
    .context("cannot make the client certificate")?;
    leaves(&issuer, &[], &[], tenants, days, now, &mut files)?;
    files.push(PemFile {
        name: "gossip.key".into(),
        contents: gossip_secret()?,
        secret: true,
    });
    files.extend(token_key_files(
        &SigningKey::generate().map_err(anyhow::Error::msg)?,
    ));
    Ok(files)
}

/// The member certificate of each of `nodes` (carrying `names` too) and
/// the client certificate of each of `tenants`, signed by `issuer`.
fn leaves(
    issuer: &Issuer<'_, KeyPair>,
    nodes: &[u64],
    names: &[String],
    tenants: &[String],
    days: u32,
    now: OffsetDateTime,
    files: &mut Vec<PemFile>,
) -> anyhow::Result<()> {
    for &node in nodes {
        let mut sans = vec![
            floret_server::member_name(node),
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        sans.extend(
            names
                .iter()
                .map(|name| name.replace("{id}", &node.to_string())),
        );
        leaf(
            issuer,
            (format!("node-{node}"), format!("floret node {node}")),
            sans,
            true,
            (days, now),
            files,
        )
        .with_context(|| format!("cannot make node {node}'s certificate"))?;
    }
    for tenant in tenants {
        leaf(
            issuer,
            (
                format!("tenant-{tenant}"),
                format!("floret tenant {tenant}"),
            ),
            vec![floret_server::auth::tenant_certificate_name(tenant)],
            false,
            (days, now),
            files,
        )
        .with_context(|| format!("cannot make tenant {tenant}'s certificate"))?;
    }
    Ok(())
}

/// One certificate and its key, `stem.pem` and `stem.key`, naming
/// `common_name` and carrying `sans`; a server's is also a client's.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    (stem, common_name): (String, String),
    sans: Vec<String>,
    server: bool,
    (days, now): (u32, OffsetDateTime),
    files: &mut Vec<PemFile>,
) -> anyhow::Result<()> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = if server {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    validity(&mut params, days, now);
    let cert = params.signed_by(&key, issuer)?;
    files.push(PemFile {
        name: format!("{stem}.pem"),
        contents: cert.pem(),
        secret: false,
    });
    files.push(PemFile {
        name: format!("{stem}.key"),
        contents: key.serialize_pem(),
        secret: true,
    });
    Ok(())
}

/// The private and public halves of a token signing key.
fn token_key_files(key: &SigningKey) -> [PemFile; 2] {
    [
        PemFile {
            name: "token.key".into(),
            contents: key.to_pem(),
            secret: true,
        },
        PemFile {
            name: "token.pub".into(),
            contents: key.public_pem(),
            secret: false,
        },
    ]
}

/// Writes `key` into `dir` as token.key and token.pub (neither may exist).
pub fn write_token_keys(dir: &Path, key: &SigningKey) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for file in token_key_files(key) {
        write_new(&dir.join(&file.name), &file.contents, file.secret)?;
    }
    Ok(())
}

/// Writes a new gossip secret into `dir` (for a set of certificates made
/// before `floret certs` wrote one).
pub fn write_gossip_key(dir: &Path) -> anyhow::Result<()> {
    write_new(&dir.join("gossip.key"), &gossip_secret()?, true)
}

/// 32 random bytes in hex, and a newline.
fn gossip_secret() -> anyhow::Result<String> {
    use ring::rand::SecureRandom;
    let mut secret = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
    let hex: String = secret.iter().map(|byte| format!("{byte:02x}")).collect();
    Ok(hex + "\n")
}

/// Writes a file that must not exist yet; private keys readable by the owner alone.
fn write_new(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_list_or_count() {
        assert_eq!(parse_nodes("3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_nodes("1, 2,5").unwrap(), vec![1, 2, 5]);
        assert!(parse_nodes("0").is_err());
        assert!(parse_nodes("two").is_err());
    }

    #[test]
    fn every_node_gets_a_certificate_and_a_key() {
        let files = make(
            &[1, 4],
            &["floret-{id}.svc".into()],
            &["acme".into()],
            30,
            OffsetDateTime::now_utc(),
        )
        .unwrap();
        let names: Vec<&str> = files.iter().map(|file| file.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ca.pem",
                "ca.key",
                "node-1.pem",
                "node-1.key",
                "node-4.pem",
                "node-4.key",
                "client.pem",
                "client.key",
                "tenant-acme.pem",
                "tenant-acme.key",
                "gossip.key",
                "token.key",
                "token.pub"
            ]
        );
        assert!(
            files
                .iter()
                .all(|file| file.secret == file.name.ends_with(".key"))
        );
    }
}
