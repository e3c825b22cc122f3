//! This node's side of the gossip view: publishes its load a few times a
//! second and hands the latest view of every node to the services (cluster
//! status shows it; leadership steering takes it as a hint), and runs the
//! introductions of members gossip has not reached (`gossip_reach.rs`). The
//! view is refreshed on its own timer, so a dispatcher slow to report its
//! load (a failover's recovery) does not leave a dead node alive in it.
//!
//! Published per queue: backlogged producers and their weight and the
//! backlog (from the dispatcher of the shards this node leads), backlog
//! bytes (from those shards' durable producer records, re-read every
//! [`BYTES_REFRESH`]), the recent dispatch rate and the consumers here; and
//! per tenant with limits, what it stores in those shards and asks of this
//! node ([`TenantLimits::report`]).
//! Gossip's own traffic is exported as the `floret_gossip_sent_bytes_total`
//! and `floret_gossip_received_bytes_total` metrics, and the datagrams it
//! dropped (a tag that does not verify under the cluster's secret, a
//! timestamp out of its window, too large to seal) as
//! `floret_gossip_dropped_datagrams_total`.
//!
//! IMPLEMENTATION CAVEATS
//! - A one-node cluster runs no gossip; its services see no view.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floret_cluster::{
    Gossip, GossipConfig, GossipError, GossipSecret, NodeReport, QueueLoad, Shards, View,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{Config, GossipSettings};
use crate::deliver::DispatcherHandle;
use crate::produce::tenant_limits::TenantLimits;

/// How often backlog bytes are summed from the durable producer records.
const BYTES_REFRESH: Duration = Duration::from_secs(2);

/// The running gossip agent and the latest view.
pub struct LoadView {
    gossip: Arc<Gossip>,
    view: watch::Receiver<Arc<View>>,
    warning: watch::Receiver<Option<String>>,
    publisher: JoinHandle<()>,
    refresher: JoinHandle<()>,
    introducer: JoinHandle<()>,
}

/// What cluster status shows of this node's gossip.
#[derive(Debug, Clone)]
pub struct GossipStatus {
    /// The latest view, refreshed every gossip interval.
    pub view: watch::Receiver<Arc<View>>,
    /// Where the other nodes reach this node's gossip.
    pub advertise: SocketAddr,
    /// Set while no other node's gossip is heard though TCP reaches them.
    pub warning: watch::Receiver<Option<String>>,
}

impl LoadView {
    /// Starts gossiping (`bound` is the gRPC listener's address), sealed
    /// with `secret` if given, and publishing; None for a one-node cluster.
    pub async fn start(
        config: &Config,
        bound: SocketAddr,
        secret: Option<GossipSecret>,
        shards: Arc<Shards>,
        dispatcher: DispatcherHandle,
        tenant_limits: Arc<TenantLimits>,
    ) -> Result<Option<Self>, GossipError> {
        let peers = shards.peers().clone();
        if peers.others().next().is_none() {
            return Ok(None);
        }
        let listen = config.gossip.listen.unwrap_or(bound);
        let own_address = peers.address(peers.node_id()).unwrap_or_default();
        let advertise = match tokio::net::lookup_host(&own_address).await {
            Ok(mut resolved) => resolved
                .next()
                .map_or(listen, |addr| SocketAddr::new(addr.ip(), listen.port())),
            Err(_) => listen,
        };
        let interval = Duration::from_millis(config.gossip.interval_ms);
        let gossip = Arc::new(
            Gossip::start(
                peers.node_id(),
                &own_address,
                GossipConfig {
                    listen,
                    advertise,
                    seeds: peers
                        .others()
                        .filter_map(|node| peers.address(node))
                        .collect(),
                    interval,
                    phi_threshold: config.gossip.phi_threshold,
                    cluster_name: config.cluster_name.clone(),
                    secret,
                },
            )
            .await?,
        );
        let (sender, view) = watch::channel(Arc::new(View::new()));
        let (warn, warning) = watch::channel(None);
        let introducer = tokio::spawn(crate::gossip_reach::run(
            gossip.clone(),
            peers,
            view.clone(),
            warn,
        ));
        let publisher = tokio::spawn(publish(
            gossip.clone(),
            shards,
            dispatcher,
            tenant_limits,
            interval,
        ));
        let refresher = tokio::spawn(refresh(gossip.clone(), interval, sender));
        Ok(Some(Self {
            gossip,
            view,
            warning,
            publisher,
            refresher,
            introducer,
        }))
    }

    /// The view, this node's gossip address and its warning.
    pub fn status(&self) -> GossipStatus {
        GossipStatus {
            view: self.view.clone(),
            advertise: self.gossip.advertise(),
            warning: self.warning.clone(),
        }
    }

    /// Stops publishing and gossiping.
    pub async fn stop(self) {
        self.publisher.abort();
        self.refresher.abort();
        self.introducer.abort();
        let _ = self.publisher.await;
        let _ = self.refresher.await;
        let _ = self.introducer.await;
        match Arc::try_unwrap(self.gossip) {
            Ok(gossip) => gossip.shutdown().await,
            Err(_) => tracing::debug!("gossip still shared at shutdown"),
        }
    }
}

/// Publishes this node's load every `interval`, as the dispatcher reports it.
async fn publish(
    gossip: Arc<Gossip>,
    shards: Arc<Shards>,
    dispatcher: DispatcherHandle,
    tenant_limits: Arc<TenantLimits>,
    interval: Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut delivered_before: HashMap<String, u64> = HashMap::new();
    let mut measured_at = Instant::now();
    let mut bytes: HashMap<String, u64> = HashMap::new();
    let mut bytes_at: Option<Instant> = None;
    loop {
        ticks.tick().await;
        let Ok(activity) = dispatcher.activity(false).await else {
            return;
        };
        if bytes_at.is_none_or(|at| at.elapsed() >= BYTES_REFRESH) {
            let led = shards.clone();
            if let Ok(summed) = tokio::task::spawn_blocking(move || backlog_bytes(&led)).await {
                bytes = summed;
            }
            bytes_at = Some(Instant::now());
        }
        let seconds = measured_at.elapsed().as_secs_f64().max(1e-3);
        measured_at = Instant::now();
        let mut report = NodeReport {
            shards_led: shards
                .groups()
                .filter(|group| shards.leads(group.id))
                .map(|group| group.id)
                .collect(),
            queues: Default::default(),
            tenants: tenant_limits.report(Instant::now()),
        };
        for (queue, activity) in activity {
            let before = delivered_before.insert(queue.clone(), activity.delivered);
            let load = QueueLoad {
                backlogged_producers: activity.backlogged_producers,
                backlogged_weight: activity.backlogged_weight,
                messages: activity.ready + activity.in_flight,
                bytes: bytes.get(&queue).copied().unwrap_or(0),
                dispatch_rate: activity.delivered.saturating_sub(before.unwrap_or(0)) as f64
                    / seconds,
                consumers: activity.consumers,
            };
            if load != QueueLoad::default() {
                report.queues.insert(queue, load);
            }
        }
        gossip.publish(&report).await;
    }
}

/// Hands the services the latest view, and exports gossip's traffic, every
/// `interval`: whatever the dispatcher is doing.
async fn refresh(gossip: Arc<Gossip>, interval: Duration, view: watch::Sender<Arc<View>>) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let (sent, received) = gossip.traffic().totals();
        metrics::counter!("floret_gossip_sent_bytes_total").absolute(sent);
        metrics::counter!("floret_gossip_received_bytes_total").absolute(received);
        metrics::counter!("floret_gossip_dropped_datagrams_total")
            .absolute(gossip.traffic().dropped());
        if view.send(Arc::new(gossip.view().await)).is_err() {
            return;
        }
    }
}

/// The gossip secret `settings` name: read from its file (surrounding
/// whitespace trimmed) or given as is; none when not configured.
pub fn gossip_secret(settings: &GossipSettings) -> Result<Option<GossipSecret>, String> {
    let text = match (&settings.secret_file, &settings.secret) {
        (Some(path), _) => std::fs::read_to_string(path).map_err(|error| {
            format!("cannot read gossip.secret_file {}: {error}", path.display())
        })?,
        (None, Some(secret)) => secret.0.clone(),
        (None, None) => return Ok(None),
    };
    GossipSecret::new(text.trim().as_bytes()).map(Some)
}

/// Stored bytes per queue over the shards this node leads.
fn backlog_bytes(shards: &Shards) -> HashMap<String, u64> {
    let mut bytes = HashMap::new();
    for group in shards.groups().filter(|group| shards.leads(group.id)) {
        for entry in group.reader.producers().flatten() {
            *bytes.entry(entry.queue).or_insert(0) += entry.record.bytes;
        }
    }
    bytes
}
