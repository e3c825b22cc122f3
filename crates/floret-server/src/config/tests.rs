//! The configuration's loading, overrides and checks.

use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn defaults_are_valid() {
    Config::load(None, no_env).unwrap().validate().unwrap();
}

#[test]
fn file_then_environment_override_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("floret.toml");
    std::fs::write(
        &path,
        "node_id = 3\nshards = 4\n[delivery]\nlease_timeout_ms = 500\n",
    )
    .unwrap();
    let config = Config::load(Some(&path), |name| {
        (name == "FLORET_SHARDS").then(|| "8".to_owned())
    })
    .unwrap();
    assert_eq!(
        (
            config.node_id,
            config.shards,
            config.delivery.lease_timeout_ms
        ),
        (3, Some(8), 500)
    );
}

#[test]
fn free_space_watermark_cannot_be_lowered_without_a_config_file() {
    let config = Config::load(None, |name| {
        (name == "FLORET_MIN_FREE_BYTES").then(|| "1048576".to_owned())
    })
    .unwrap();
    assert_eq!(config.storage.min_free_bytes, 1 << 20);
}

#[test]
fn unknown_key_in_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("floret.toml");
    std::fs::write(&path, "shard = 4\n").unwrap();
    let error = Config::load(Some(&path), no_env).unwrap_err();
    assert!(error.to_string().contains("unknown field"), "{error}");
}

#[test]
fn unparsable_environment_value_names_the_variable() {
    let error = Config::load(None, |name| {
        (name == "FLORET_NODE_ID").then(|| "two".to_owned())
    })
    .unwrap_err();
    assert!(error.to_string().contains("FLORET_NODE_ID=two"), "{error}");
}

#[test]
fn election_timeout_below_heartbeat_is_refused() {
    let mut config = Config::default();
    config.raft.election_timeout_min_ms = config.raft.heartbeat_ms;
    let error = config.validate().unwrap_err();
    assert!(
        error.to_string().contains("election_timeout_min_ms"),
        "{error}"
    );
}

#[test]
fn example_config_in_deploy_spells_out_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/floret.toml");
    assert_eq!(
        Config::load(Some(&path), no_env).unwrap(),
        Config::default()
    );
}

#[test]
fn peers_parse_from_the_flag_form_and_must_include_this_node() {
    let peers = parse_peers("1=127.0.0.1:7701, 2=127.0.0.1:7702,3=n3:7703").unwrap();
    assert_eq!(peers.len(), 3);
    assert_eq!(peers[2].address, "n3:7703");
    let config = Config {
        node_id: 4,
        peers,
        ..Config::default()
    };
    let error = config.validate().unwrap_err();
    assert!(error.to_string().contains("node_id 4"), "{error}");
    assert!(parse_peers("1:127.0.0.1:7701").is_err());
}

#[test]
fn entries_too_large_for_a_log_frame_are_refused() {
    let mut config = Config::default();
    config.limits.max_request_bytes = 40 * 1024 * 1024;
    let error = config.validate().unwrap_err();
    assert!(error.to_string().contains("max_request_bytes"), "{error}");
}

#[test]
fn zero_shards_is_refused() {
    let config = Config {
        shards: Some(0),
        ..Config::default()
    };
    assert!(config.validate().is_err());
}

#[test]
fn peer_port_on_the_client_port_is_refused() {
    let config = Config {
        listen: "127.0.0.1:7701".parse().unwrap(),
        peers: parse_peers("1=127.0.0.1:7701,2=127.0.0.1:7702").unwrap(),
        ..Config::default()
    };
    let error = config.validate().unwrap_err();
    assert!(error.to_string().contains("peer port"), "{error}");
    let config = Config {
        peer_listen: Some("127.0.0.1:7701".parse().unwrap()),
        ..Config::default()
    };
    assert!(config.validate().is_err());
    let listening_everywhere = Config {
        listen: "0.0.0.0:7701".parse().unwrap(),
        insecure: true,
        peers: parse_peers("1=n1:7701,2=n2:7701").unwrap(),
        ..Config::default()
    };
    let error = listening_everywhere.validate().unwrap_err();
    assert!(error.to_string().contains("peer port"), "{error}");
    let everywhere_on_the_peer_port = Config {
        listen: "127.0.0.1:7701".parse().unwrap(),
        peer_listen: Some("0.0.0.0:7701".parse().unwrap()),
        insecure: true,
        ..Config::default()
    };
    assert!(everywhere_on_the_peer_port.validate().is_err());
}

#[test]
fn clients_are_told_the_peer_host_with_the_client_port_when_listening_everywhere() {
    let config = Config {
        node_id: 2,
        peers: parse_peers("1=n1:7801,2=n2:7801").unwrap(),
        ..Config::default()
    };
    assert_eq!(
        config.advertised_address("0.0.0.0:7701".parse().unwrap()),
        "n2:7701"
    );
    assert_eq!(
        config.advertised_address("10.0.0.2:7701".parse().unwrap()),
        "10.0.0.2:7701"
    );
    let config = Config {
        advertise: Some("floret-2.example:443".into()),
        ..config
    };
    assert_eq!(
        config.advertised_address("0.0.0.0:7701".parse().unwrap()),
        "floret-2.example:443"
    );
}

#[test]
fn plaintext_off_loopback_needs_insecure_and_tls_needs_its_pieces() {
    let everywhere = Config {
        listen: "0.0.0.0:7701".parse().unwrap(),
        ..Config::default()
    };
    let error = everywhere.validate().unwrap_err();
    assert!(error.to_string().contains("--insecure"), "{error}");
    Config {
        insecure: true,
        ..everywhere.clone()
    }
    .validate()
    .unwrap();
    let with_tls = Config {
        tls: TlsSettings {
            cert: Some("node.pem".into()),
            key: Some("node.key".into()),
            ca: None,
        },
        auth: with_token_keys(),
        ..everywhere.clone()
    };
    with_tls.validate().unwrap();
    let without_key = Config {
        tls: TlsSettings {
            key: None,
            ..with_tls.tls.clone()
        },
        ..everywhere.clone()
    };
    assert!(without_key.validate().is_err());
    let cluster_without_ca = Config {
        peers: parse_peers("1=n1:7801,2=n2:7801").unwrap(),
        ..with_tls
    };
    let error = cluster_without_ca.validate().unwrap_err();
    assert!(error.to_string().contains("tls.ca"), "{error}");
    let exposed_peer_port = Config {
        peer_listen: Some("10.0.0.1:7801".parse().unwrap()),
        ..Config::default()
    };
    assert!(exposed_peer_port.validate().is_err());
}

fn with_token_keys() -> AuthSettings {
    AuthSettings {
        token_keys: vec!["token.pub".into()],
        ..AuthSettings::default()
    }
}

fn acme_certificate() -> CertificateTenant {
    CertificateTenant {
        name: "acme.tenant.floret".into(),
        tenant: "acme".into(),
        roles: vec![crate::auth::Role::Produce],
        queues: vec!["acme.*".into()],
    }
}

#[test]
fn client_certificates_that_no_tls_port_could_ask_for_are_refused() {
    let tls = TlsSettings {
        cert: Some("node.pem".into()),
        key: Some("node.key".into()),
        ca: None,
    };
    let with_certificates = |tls: TlsSettings, client_ca: Option<&str>| Config {
        tls,
        auth: AuthSettings {
            client_ca: client_ca.map(Into::into),
            client_certificates: vec![acme_certificate()],
            ..AuthSettings::default()
        },
        ..Config::default()
    };
    let alone = with_certificates(tls.clone(), Some("clients.pem")).validate();
    assert!(alone.is_ok(), "certificates alone name tenants: {alone:?}");
    let no_ca = with_certificates(tls.clone(), None).validate().unwrap_err();
    assert!(no_ca.to_string().contains("auth.client_ca"), "{no_ca}");
    let plaintext = with_certificates(TlsSettings::default(), Some("clients.pem"))
        .validate()
        .unwrap_err();
    assert!(plaintext.to_string().contains("tls.cert"), "{plaintext}");
    let no_mapping = Config {
        tls: tls.clone(),
        auth: AuthSettings {
            client_ca: Some("clients.pem".into()),
            ..AuthSettings::default()
        },
        ..Config::default()
    }
    .validate()
    .unwrap_err();
    assert!(
        no_mapping.to_string().contains("auth.client_certificates"),
        "{no_mapping}"
    );
    for (bad, says) in [
        (
            CertificateTenant {
                name: "not a name".into(),
                ..acme_certificate()
            },
            "DNS name",
        ),
        (
            CertificateTenant {
                tenant: "acme/eu".into(),
                ..acme_certificate()
            },
            "tenant",
        ),
        (
            CertificateTenant {
                roles: vec![],
                ..acme_certificate()
            },
            "roles",
        ),
        (
            CertificateTenant {
                queues: vec!["acme/*".into()],
                ..acme_certificate()
            },
            "acme/*",
        ),
    ] {
        let mut config = with_certificates(tls.clone(), Some("clients.pem"));
        config.auth.client_certificates = vec![bad];
        let refused = config.validate().unwrap_err();
        assert!(refused.to_string().contains(says), "{says}: {refused}");
    }
    let mut twice = with_certificates(tls, Some("clients.pem"));
    twice.auth.client_certificates.push(CertificateTenant {
        tenant: "globex".into(),
        ..acme_certificate()
    });
    let refused = twice.validate().unwrap_err();
    assert!(refused.to_string().contains("twice"), "{refused}");
}

#[test]
fn client_port_off_loopback_lets_anyone_act_as_any_tenant() {
    let tls = TlsSettings {
        cert: Some("node.pem".into()),
        key: Some("node.key".into()),
        ca: None,
    };
    let without_keys = Config {
        listen: "0.0.0.0:7701".parse().unwrap(),
        tls,
        ..Config::default()
    };
    let error = without_keys.validate().unwrap_err().to_string();
    assert!(error.contains("token keys"), "{error}");
    Config {
        auth: with_token_keys(),
        ..without_keys.clone()
    }
    .validate()
    .unwrap();
    Config {
        insecure: true,
        ..without_keys
    }
    .validate()
    .unwrap();
    let loopback = Config::default();
    loopback.validate().unwrap();
    let from_env = Config::load(None, |name| {
        (name == "FLORET_TOKEN_KEYS").then(|| "a.pub, b.pub".to_owned())
    })
    .unwrap();
    assert_eq!(
        from_env.auth.token_keys,
        vec![PathBuf::from("a.pub"), PathBuf::from("b.pub")]
    );
}

#[test]
fn tokens_are_bypassed_through_a_plaintext_peer_port() {
    let insecure_cluster = Config {
        listen: "0.0.0.0:7701".parse().unwrap(),
        peers: parse_peers("1=n1:7801,2=n2:7801").unwrap(),
        auth: with_token_keys(),
        insecure: true,
        ..Config::default()
    };
    let error = insecure_cluster.validate().unwrap_err().to_string();
    assert!(error.contains("peer port"), "{error}");
    let on_loopback = Config {
        listen: "127.0.0.1:7701".parse().unwrap(),
        ..insecure_cluster
    };
    on_loopback.validate().unwrap();
    let emptied = Config::load(None, |name| {
        (name == "FLORET_TOKEN_KEYS").then(|| " , ".to_owned())
    });
    assert!(
        emptied.is_err(),
        "an empty FLORET_TOKEN_KEYS turns tokens off"
    );
}

#[test]
fn cluster_gossiping_off_loopback_needs_a_secret() {
    let tls = TlsSettings {
        cert: Some("node.pem".into()),
        key: Some("node.key".into()),
        ca: Some("ca.pem".into()),
    };
    let unsealed = Config {
        listen: "0.0.0.0:7701".parse().unwrap(),
        peers: parse_peers("1=n1:7801,2=n2:7801").unwrap(),
        tls,
        auth: with_token_keys(),
        ..Config::default()
    };
    let error = unsealed.validate().unwrap_err();
    assert!(error.to_string().contains("gossip"), "{error}");
    let sealed = Config {
        gossip: GossipSettings {
            secret: Some(SecretText("sixteen bytes or more".into())),
            ..GossipSettings::default()
        },
        ..unsealed.clone()
    };
    sealed.validate().unwrap();
    let short = Config {
        gossip: GossipSettings {
            secret: Some(SecretText("short".into())),
            ..GossipSettings::default()
        },
        ..unsealed
    };
    assert!(short.validate().is_err());
    assert_eq!(format!("{:?}", SecretText("hunter2".into())), "<redacted>");
}

#[test]
fn peer_listen_and_advertise_come_from_the_environment() {
    let env = |name: &str| match name {
        "FLORET_PEER_LISTEN" => Some("0.0.0.0:7801".to_owned()),
        "FLORET_ADVERTISE" => Some("n1:7701".to_owned()),
        _ => None,
    };
    let config = Config::load(None, env).unwrap();
    assert_eq!(config.peer_listen, Some("0.0.0.0:7801".parse().unwrap()));
    assert_eq!(config.advertise.as_deref(), Some("n1:7701"));
}

#[test]
fn a_nested_setting_could_not_be_set_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("floret.toml");
    std::fs::write(
        &path,
        "[raft]\nheartbeat_ms = 40\nelection_timeout_min_ms = 250\n",
    )
    .unwrap();
    let variables = [
        ("FLORET_RAFT__ELECTION_TIMEOUT_MIN_MS", "300"),
        ("FLORET_BACKPRESSURE__HIGH_WATERMARK_BYTES", "1000000"),
        ("FLORET_FAIRNESS__CROSS_NODE_SPLIT", "false"),
        ("FLORET_CLUSTER_NAME", "flat variables are not nested ones"),
        ("HOME", "/root"),
    ]
    .map(|(name, value)| (name.to_owned(), value.to_owned()));
    let config = Config::load_overlaid(Some(&path), no_env, variables).unwrap();
    assert_eq!(
        config.raft.election_timeout_min_ms, 300,
        "the variable beats the file"
    );
    assert_eq!(config.raft.heartbeat_ms, 40, "the file's other keys stay");
    assert_eq!(config.backpressure.high_watermark_bytes, 1_000_000);
    assert!(!config.fairness.cross_node_split);
    assert_eq!(config.cluster_name, "floret");

    let unknown = Config::load_overlaid(
        None,
        no_env,
        [(
            "FLORET_RAFT__ELECTION_TIMEOUT_MINIMUM".to_owned(),
            "3".to_owned(),
        )],
    )
    .unwrap_err()
    .to_string();
    assert!(
        unknown.contains("FLORET_RAFT__ELECTION_TIMEOUT_MINIMUM")
            && unknown.contains("unknown field"),
        "{unknown}"
    );
    let mistyped = Config::load_overlaid(
        None,
        no_env,
        [("FLORET_RAFT__HEARTBEAT_MS".to_owned(), "fast".to_owned())],
    )
    .unwrap_err()
    .to_string();
    assert!(mistyped.contains("FLORET_RAFT__HEARTBEAT_MS"), "{mistyped}");
}

#[test]
fn config_print_could_not_say_where_a_setting_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("floret.toml");
    std::fs::write(
        &path,
        "shards = 4\n[raft]\nheartbeat_ms = 40\n[gossip]\nsecret = \"s3cret-s3cret-s3cret\"\n",
    )
    .unwrap();
    let origins = Config::origins(
        Some(&path),
        |name| (name == "FLORET_NODE_ID").then(|| "2".to_owned()),
        vec![(
            "FLORET_RAFT__ELECTION_TIMEOUT_MIN_MS".to_owned(),
            "300".to_owned(),
        )],
    )
    .unwrap();
    let of = |path: &str| {
        origins
            .iter()
            .find(|setting| setting.path == path)
            .map(|setting| (setting.value.as_str(), setting.origin.as_str()))
            .unwrap_or_else(|| panic!("{path} not listed"))
    };
    let file = format!("file {}", path.display());
    assert_eq!(of("shards"), ("4", file.as_str()));
    assert_eq!(of("raft.heartbeat_ms"), ("40", file.as_str()));
    assert_eq!(
        of("raft.election_timeout_min_ms"),
        ("300", "FLORET_RAFT__ELECTION_TIMEOUT_MIN_MS")
    );
    assert_eq!(of("node_id"), ("2", "FLORET_NODE_ID"));
    assert_eq!(of("cluster_name"), ("\"floret\"", "default"));
    assert_eq!(
        of("gossip.secret"),
        ("\"<redacted>\"", file.as_str()),
        "a secret is never printed"
    );
}

#[test]
fn sizes_and_durations_take_human_units_in_the_file_and_variables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("floret.toml");
    std::fs::write(
        &path,
        "[storage]\ncache_bytes = \"32MiB\"\n[raft]\nheartbeat_ms = \"1s\"\nelection_timeout_min_ms = 2000\n",
    )
    .unwrap();
    let config = Config::load_overlaid(
        Some(&path),
        |name| (name == "FLORET_LEASE_TIMEOUT_MS").then(|| "30s".to_owned()),
        [(
            "FLORET_BACKPRESSURE__HIGH_WATERMARK_BYTES".to_owned(),
            "2GiB".to_owned(),
        )],
    )
    .unwrap();
    assert_eq!(config.storage.cache_bytes, 32 << 20);
    assert_eq!(config.raft.heartbeat_ms, 1_000);
    assert_eq!(config.raft.election_timeout_min_ms, 2_000);
    assert_eq!(config.delivery.lease_timeout_ms, 30_000);
    assert_eq!(config.backpressure.high_watermark_bytes, 2 << 30);
    let refused = Config::load_overlaid(
        None,
        no_env,
        [("FLORET_STORAGE__CACHE_BYTES".to_owned(), "64MB".to_owned())],
    )
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("FLORET_STORAGE__CACHE_BYTES") && refused.contains("MiB"),
        "{refused}"
    );
}

#[test]
fn a_larger_founding_cluster_gets_more_shards_by_default() {
    assert_eq!(super::default_shards(1), 6);
    assert_eq!(super::default_shards(3), 6);
    assert_eq!(super::default_shards(5), 10);
    assert_eq!(super::default_shards(7), 14);
}
