//! Making sure gossip reaches every member, and saying so when it does not.
//!
//! Every [`INTRODUCE_EVERY`], each member the view does not call alive is
//! asked over the peer API (TCP) for its gossip address (`Peer.NodeStatus`
//! answers it), and this node starts a gossip round with it there. Gossip
//! addresses are therefore never guessed: a member whose gossip listens
//! elsewhere than its peer port's number is still found.
//!
//! When no other member has been alive in the view for
//! [`SILENCE_WARNING_AFTER`] while at least one answers over TCP, gossip is
//! blocked (a firewall that passes only TCP, a wrong address): the node logs
//! a warning, shows it in cluster status (`gossip_warning`) and sets the
//! `floret_gossip_isolated` gauge to 1. Delivery does not depend on the view
//! (`service/fan_in/`); the status's liveness and load figures do.
//!
//! IMPLEMENTATION CAVEATS
//! - Partial blocking (some members heard, others not) is not warned
//!   about; the unheard members are still introduced every round.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floret_cluster::{Gossip, Liveness, Peers, View};
use floret_proto::peer::v1::NodeStatusRequest;
use floret_store::NodeId;
use tokio::sync::watch;

/// How often unheard members are looked up and introduced.
pub const INTRODUCE_EVERY: Duration = Duration::from_secs(2);
/// How long no member may be heard, while one answers over TCP, before the
/// node warns.
pub const SILENCE_WARNING_AFTER: Duration = Duration::from_secs(10);
/// How long asking a member for its gossip address may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether gossip has been silent too long, from what each round saw.
#[derive(Debug, Clone)]
pub struct SilenceWatch {
    /// When another member was last alive in the view (or the watch began).
    last_heard: Instant,
    warning: bool,
}

/// What a round changed about the warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Silence {
    /// No member heard for too long while TCP works: warn.
    Began,
    /// A member is heard again.
    Ended,
}

impl SilenceWatch {
    /// A watch that starts counting at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            last_heard: now,
            warning: false,
        }
    }

    /// One round at `now`: whether any other member is alive in the view,
    /// and whether any answered over TCP.
    pub fn observe(
        &mut self,
        now: Instant,
        heard: bool,
        reached_over_tcp: bool,
    ) -> Option<Silence> {
        if heard {
            self.last_heard = now;
        }
        let warn = !heard
            && reached_over_tcp
            && now.saturating_duration_since(self.last_heard) >= SILENCE_WARNING_AFTER;
        match (self.warning, warn, heard) {
            (false, true, _) => {
                self.warning = true;
                Some(Silence::Began)
            }
            (true, _, true) => {
                self.warning = false;
                Some(Silence::Ended)
            }
            _ => None,
        }
    }
}

/// Introduces unheard members and keeps the warning up to date until the
/// view's sender is gone.
pub async fn run(
    gossip: Arc<Gossip>,
    peers: Arc<Peers>,
    mut view: watch::Receiver<Arc<View>>,
    warning: watch::Sender<Option<String>>,
) {
    let mut silence = SilenceWatch::new(Instant::now());
    let mut ticks = tokio::time::interval(INTRODUCE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if view.has_changed().is_err() {
            return;
        }
        let current = view.borrow_and_update().clone();
        let others: Vec<NodeId> = peers.others().collect();
        let unheard: Vec<NodeId> = others
            .iter()
            .copied()
            .filter(|node| {
                current
                    .get(node)
                    .is_none_or(|seen| seen.liveness != Liveness::Alive)
            })
            .collect();
        let mut reached = false;
        for node in &unheard {
            match gossip_address_of(&peers, *node).await {
                Ok(address) => {
                    reached = true;
                    gossip.introduce(address);
                }
                Err(reason) => {
                    tracing::debug!(node, %reason, "cannot learn a member's gossip address")
                }
            }
        }
        let heard = unheard.len() < others.len();
        match silence.observe(Instant::now(), heard, reached) {
            Some(Silence::Began) => {
                let text = format!(
                    "no gossip heard from any of nodes {unheard:?} for {}s though they answer over TCP: UDP to their gossip addresses is blocked; delivery goes on, liveness and load in the status go stale",
                    SILENCE_WARNING_AFTER.as_secs()
                );
                tracing::warn!(own_gossip_address = %gossip.advertise(), "{text}");
                warning.send_replace(Some(text));
            }
            Some(Silence::Ended) => {
                tracing::info!("gossip heard again");
                warning.send_replace(None);
            }
            None => {}
        }
        let isolated = warning.borrow().is_some();
        metrics::gauge!("floret_gossip_isolated").set(if isolated { 1.0 } else { 0.0 });
    }
}

/// `node`'s gossip address, as it answers over the peer API.
async fn gossip_address_of(peers: &Peers, node: NodeId) -> Result<SocketAddr, String> {
    let mut client = peers
        .peer_client(node)
        .ok_or_else(|| format!("node {node} is not a member"))?;
    let answer = tokio::time::timeout(ASK_TIMEOUT, client.node_status(NodeStatusRequest {}))
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|status| status.message().to_owned())?
        .into_inner();
    let own = answer
        .nodes
        .iter()
        .find(|status| status.node_id == node)
        .ok_or_else(|| format!("node {node} did not describe itself"))?;
    own.gossip_address
        .parse()
        .map_err(|_| format!("node {node} gossips at {:?}", own.gossip_address))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gossip_blocked_by_a_firewall_goes_unnoticed() {
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut watch = SilenceWatch::new(start);
        assert_eq!(watch.observe(at(2), false, true), None);
        assert_eq!(watch.observe(at(9), false, true), None);
        assert_eq!(watch.observe(at(10), false, true), Some(Silence::Began));
        assert_eq!(watch.observe(at(12), false, true), None, "warned once");
        assert_eq!(watch.observe(at(14), true, true), Some(Silence::Ended));
        assert_eq!(
            watch.observe(at(30), false, false),
            None,
            "peers down, not gossip blocked"
        );
        assert_eq!(watch.observe(at(32), false, true), Some(Silence::Began));
    }
}
