//! [`Config::validate`]: every value checked, the first wrong one named.
//! One check per concern: the cluster, requests and storage, raft and
//! batching, backpressure.

use std::collections::BTreeSet;

use super::{Config, ConfigError};

impl Config {
    /// Checks every value, naming the first that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_cluster()
            .and_then(|()| self.check_transport_security())
            .and_then(|()| self.check_requests_and_storage())
            .and_then(|()| self.check_raft_and_batching())
            .and_then(|()| self.check_backpressure())
            .map_err(ConfigError::Invalid)
    }

    fn check_cluster(&self) -> Result<(), String> {
        if self.node_id == 0 {
            return Err("node_id must be > 0".into());
        }
        if let Some(shards) = self.shards
            && (shards == 0 || shards > 1024)
        {
            return Err(format!("shards must be in 1..=1024, not {shards}"));
        }
        if !self.peers.is_empty() {
            let ids: BTreeSet<u64> = self.peers.iter().map(|p| p.id).collect();
            if ids.len() != self.peers.len() || ids.contains(&0) {
                return Err("peers must have distinct node ids > 0".into());
            }
            if !ids.contains(&self.node_id) {
                return Err(format!(
                    "peers must list this node (node_id {}) with the address the others dial",
                    self.node_id
                ));
            }
            if let Some(peer) = self.peers.iter().find(|p| p.address.is_empty()) {
                return Err(format!("peer {} has no address", peer.id));
            }
        }
        if self.membership.moves_at_once == 0 {
            return Err("membership.moves_at_once must be > 0".into());
        }
        if !self.join.is_empty() {
            if !self.peers.is_empty() {
                return Err("give peers for a cluster's first start, or join to join a running one, not both".into());
            }
            if self.peer_listen.is_none() {
                return Err("a node that joins needs peer_listen (--peer-listen): the port the members dial, at the address given to `floret cluster add-node`".into());
            }
            if let Some(member) = self
                .join
                .iter()
                .find(|member| member.id == self.node_id || member.address.is_empty())
            {
                return Err(format!(
                    "join lists the members to ask (id=host:port), not this node: {}={:?}",
                    member.id, member.address
                ));
            }
        }
        if self.listen.port() != 0 && self.peer_port_takes_the_client_port() {
            return Err(format!(
                "the peer port ({}) must differ from the client port (listen): only the other nodes may reach it",
                self.listen
            ));
        }
        if self.gossip.interval_ms == 0 || self.gossip.phi_threshold <= 0.0 {
            return Err("gossip.interval_ms and gossip.phi_threshold must be > 0".into());
        }
        let name = &self.cluster_name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "cluster_name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
            ));
        }
        if self.gossip.secret_file.is_some() && self.gossip.secret.is_some() {
            return Err("give the gossip secret once: gossip.secret_file or gossip.secret (FLORET_GOSSIP_SECRET), not both".into());
        }
        if let Some(secret) = &self.gossip.secret {
            floret_cluster::GossipSecret::new(secret.0.trim().as_bytes())?;
        }
        if self.replication_factor == 0 {
            return Err("replication_factor must be > 0".into());
        }
        Ok(())
    }

    /// Whether the peer port would bind the client port's address: the
    /// same port on the same interface, or on every interface.
    fn peer_port_takes_the_client_port(&self) -> bool {
        let peer = match self.peer_listen {
            Some(address) => Some(address),
            None => self
                .own_peer_address()
                .and_then(|own| own.rsplit_once(':'))
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .map(|port| std::net::SocketAddr::new(self.listen.ip(), port)),
        };
        peer.is_some_and(|peer| {
            peer.port() == self.listen.port()
                && (peer.ip() == self.listen.ip()
                    || peer.ip().is_unspecified()
                    || self.listen.ip().is_unspecified())
        })
    }

    /// TLS settings that belong together; no plaintext port and no
    /// unsealed gossip off loopback unless `insecure` says so.
    fn check_transport_security(&self) -> Result<(), String> {
        let tls = &self.tls;
        if tls.cert.is_some() != tls.key.is_some() {
            return Err("tls.cert and tls.key go together: give both or neither".into());
        }
        self.check_client_certificates()?;
        if tls.ca.is_some() && tls.cert.is_none() {
            return Err("tls.ca (--tls-ca, FLORET_TLS_CA) needs tls.cert and tls.key, this node's own member certificate: give them, or unset FLORET_TLS_CA to serve plaintext on loopback".into());
        }
        let has_peer_port =
            self.peer_listen.is_some() || !self.peers.is_empty() || !self.join.is_empty();
        if tls.enabled() && has_peer_port && tls.ca.is_none() {
            return Err("a node with a peer port and TLS needs tls.ca, the CA of its members' certificates: without it the peer port could not tell members from anyone else".into());
        }
        let peer_port_exposed = has_peer_port
            && self
                .peer_listen
                .map_or(!self.listen.ip().is_loopback(), |peer| {
                    !peer.ip().is_loopback()
                });
        if self.auth.enabled() && peer_port_exposed && !tls.enabled() {
            return Err("tenants (token keys or client certificates) with a plaintext peer port off loopback: anyone who reaches the peer port could produce, consume and ack as any tenant there, past every token. Give tls.cert, tls.key and tls.ca (mutual TLS lets only members in)".into());
        }
        if self.insecure {
            return Ok(());
        }
        let gossips = !self.peers.is_empty() || !self.join.is_empty();
        let gossip_ip = self
            .gossip
            .listen
            .or(self.peer_listen)
            .map_or(self.listen.ip(), |address| address.ip());
        if gossips && !self.gossip.sealed() && !gossip_ip.is_loopback() {
            return Err(format!(
                "refusing to gossip on {gossip_ip} without a secret: anyone who can send it UDP could rewrite this node's view of the cluster. Give gossip.secret_file (`floret certs` writes gossip.key) or FLORET_GOSSIP_SECRET, or --insecure on a network only the cluster can reach"
            ));
        }
        if !tls.enabled() {
            self.check_no_plaintext_off_loopback()?;
        }
        if !self.auth.enabled() && !self.listen.ip().is_loopback() {
            return Err(format!(
                "refusing to serve the client port on {} without token keys: anyone who reaches it could produce as any tenant, consume any queue and change policies. Give auth.token_keys (--token-keys, FLORET_TOKEN_KEYS; `floret certs` writes token.pub), or --insecure on a network only trusted clients can reach",
                self.listen.ip()
            ));
        }
        Ok(())
    }

    /// Client certificates need a TLS client port and their CA, and each
    /// mapping must name a tenant as a token would.
    fn check_client_certificates(&self) -> Result<(), String> {
        let auth = &self.auth;
        if auth.client_certificates.is_empty() {
            if auth.client_ca.is_some() {
                return Err("auth.client_ca without auth.client_certificates: no client certificate would name a tenant; list the certificates that stand for tenants, or drop auth.client_ca".into());
            }
            return Ok(());
        }
        if auth.client_ca.is_none() {
            return Err("auth.client_certificates need auth.client_ca, the CA that signs them: without it the client port cannot check them".into());
        }
        if !self.tls.enabled() {
            return Err(
                "auth.client_certificates need TLS on the client port: give tls.cert and tls.key"
                    .into(),
            );
        }
        let mut names = std::collections::HashSet::new();
        for mapping in &auth.client_certificates {
            let what = format!("auth.client_certificates entry {:?}", mapping.name);
            if !floret_cluster::is_dns_name(&mapping.name) {
                return Err(format!(
                    "{what}: name must be a DNS name the certificate carries"
                ));
            }
            if !names.insert(mapping.name.as_str()) {
                return Err(format!("{what}: the name is listed twice"));
            }
            crate::auth::TenantName::parse(&mapping.tenant)
                .map_err(|why| format!("{what}: tenant: {why}"))?;
            if mapping.roles.is_empty() {
                return Err(format!("{what}: roles must name at least one role"));
            }
            for pattern in &mapping.queues {
                crate::auth::QueuePattern::parse(pattern)
                    .map_err(|why| format!("{what}: {why}"))?;
            }
        }
        Ok(())
    }

    /// No port serving plaintext on an address other than loopback.
    fn check_no_plaintext_off_loopback(&self) -> Result<(), String> {
        let exposed = std::iter::once(("listen", self.listen.ip()))
            .chain(
                self.peer_listen
                    .map(|address| ("peer_listen", address.ip())),
            )
            .chain(
                self.gossip
                    .listen
                    .map(|address| ("gossip.listen", address.ip())),
            )
            .find(|(_, ip)| !ip.is_loopback());
        if let Some((setting, ip)) = exposed {
            return Err(format!(
                "refusing to serve plaintext on {ip} ({setting}) without TLS: anyone who reaches it could read messages and rewrite raft state. Give tls.cert, tls.key and tls.ca (`floret certs` makes them), or --insecure on a network only the cluster and its clients can reach"
            ));
        }
        Ok(())
    }

    fn check_requests_and_storage(&self) -> Result<(), String> {
        if self.storage.cache_bytes < 1024 * 1024 {
            return Err("storage.cache_bytes must be at least 1 MiB".into());
        }
        if self.storage.log_segment_bytes < 64 * 1024 {
            return Err("storage.log_segment_bytes must be at least 64 KiB".into());
        }
        let limits = &self.limits;
        if limits.max_payload_bytes == 0 || limits.max_payload_bytes >= limits.max_request_bytes {
            return Err(
                "limits.max_payload_bytes must be > 0 and below limits.max_request_bytes".into(),
            );
        }
        let largest_entry = limits
            .max_request_bytes
            .saturating_add(self.batching.max_entry_bytes);
        let frame_room = floret_store::wal::MAX_FRAME_BYTES / 2;
        if largest_entry > frame_room {
            return Err(format!(
                "limits.max_request_bytes plus batching.max_entry_bytes must stay under {frame_room} bytes (a raft entry must fit a log frame with room to spare)"
            ));
        }
        if limits.max_batch_messages == 0 || limits.max_credits == 0 || limits.max_connections == 0
        {
            return Err(
                "limits.max_batch_messages, limits.max_credits and limits.max_connections must be > 0"
                    .into(),
            );
        }
        let lease_timeout_ms = self.delivery.lease_timeout_ms;
        if lease_timeout_ms == 0 || lease_timeout_ms > 24 * 3600 * 1000 {
            return Err("delivery.lease_timeout_ms must be in 1..=86400000".into());
        }
        if self.producers.forget_idle_after_ms < 100 {
            return Err("producers.forget_idle_after_ms must be at least 100".into());
        }
        Ok(())
    }

    fn check_raft_and_batching(&self) -> Result<(), String> {
        let batching = &self.batching;
        if batching.max_entry_ops == 0
            || batching.proposals_in_flight == 0
            || batching.commit_timeout_ms == 0
            || batching.max_queued_calls_per_producer == 0
            || batching.max_queued_bytes_per_shard == 0
        {
            return Err(
                "batching.max_entry_ops, batching.proposals_in_flight, batching.commit_timeout_ms, batching.max_queued_calls_per_producer and batching.max_queued_bytes_per_shard must be > 0".into(),
            );
        }
        let raft = &self.raft;
        if raft.heartbeat_ms == 0 || raft.election_timeout_min_ms <= raft.heartbeat_ms {
            return Err(format!(
                "raft.election_timeout_min_ms ({}) must be above raft.heartbeat_ms ({})",
                raft.election_timeout_min_ms, raft.heartbeat_ms
            ));
        }
        if raft.election_timeout_max_ms <= raft.election_timeout_min_ms {
            return Err(
                "raft.election_timeout_max_ms must be above raft.election_timeout_min_ms".into(),
            );
        }
        if raft.snapshot_every_entries == 0 {
            return Err("raft.snapshot_every_entries must be > 0".into());
        }
        let chunk_room = floret_cluster::MAX_PEER_MESSAGE_BYTES / 2;
        if raft.snapshot_chunk_bytes < 4096 || raft.snapshot_chunk_bytes >= chunk_room as u64 {
            return Err(format!(
                "raft.snapshot_chunk_bytes must be in 4096..{chunk_room}"
            ));
        }
        if raft.max_snapshot_bytes < raft.snapshot_chunk_bytes {
            return Err(
                "raft.max_snapshot_bytes must be at least raft.snapshot_chunk_bytes".into(),
            );
        }
        Ok(())
    }

    fn check_backpressure(&self) -> Result<(), String> {
        let backpressure = &self.backpressure;
        if backpressure.low_watermark_bytes >= backpressure.high_watermark_bytes
            || backpressure.retry_after_ms == 0
        {
            return Err(format!(
                "backpressure.low_watermark_bytes ({}) must be below backpressure.high_watermark_bytes ({}), and retry_after_ms > 0",
                backpressure.low_watermark_bytes, backpressure.high_watermark_bytes
            ));
        }
        Ok(())
    }
}
