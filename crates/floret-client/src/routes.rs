//! Where a producer's produces go: straight to the node that leads its
//! shard, once a produce answer has named it (`ProduceResponse.leader_address`),
//! so the cluster does not forward the call to the leader, one hop more.
//!
//! Only the nodes the client was given are used: an address a node
//! advertises to its peers may not be reachable from the client. When the
//! leader is not one of them (a node that joined later), the producer's
//! route is the node that answered: it forwards each call to the leader.
//! A route is a hint. A node that no longer leads the shard forwards the
//! call and its answer names the new leader. A call to it that fails in
//! transport or finds the shard without a leader (UNAVAILABLE and the like,
//! not a throttle or a refusal of the request) drops the route, so the
//! next one goes to the client's nodes in turn, passing over those that
//! failed a moment ago (`node_health.rs`): a seed node that was removed
//! from the cluster or died costs a failed call now and then, not every
//! other one.
//!
//! IMPLEMENTATION CAVEATS
//! - At most [`MAX_ROUTES`] producers are remembered; past that the table
//!   starts over (the next produce of each goes through any node again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::Transport;
use floret_proto::v1::floret_client::FloretClient;

use crate::coalesce::{Coalescer, ProduceCoalescing};
use crate::node_health::NodeHealth;

/// Most producers whose leader a client remembers.
pub const MAX_ROUTES: usize = 100_000;

/// A producer's node, by the client's list of nodes.
#[derive(Default)]
struct Leaders {
    by_queue: HashMap<String, HashMap<String, usize>>,
    remembered: usize,
}

/// One of the nodes a client was given.
struct Node {
    /// Its `host:port`.
    address: String,
    /// A client connected to it alone.
    client: FloretClient<Transport>,
    /// The produce calls bound for it.
    produces: Arc<Coalescer>,
}

/// The nodes a client was given and which of them leads each producer.
pub(crate) struct Routes {
    nodes: Vec<Node>,
    leaders: Mutex<Leaders>,
    health: Mutex<NodeHealth>,
}

/// One of the client's nodes, chosen for a produce.
pub(crate) struct ChosenNode {
    /// Its place in the client's list of nodes.
    pub index: usize,
    /// Its produce calls.
    pub produces: Arc<Coalescer>,
}

/// `host:port` of an address given with or without a scheme.
pub(crate) fn host_port(address: &str) -> &str {
    let without_scheme = address.split_once("://").map_or(address, |(_, rest)| rest);
    without_scheme.trim_end_matches('/')
}

impl Routes {
    /// Routes over `nodes` (`host:port` and a client of that node alone),
    /// folding concurrent produces to each under `coalescing`.
    pub(crate) fn new(
        nodes: Vec<(String, FloretClient<Transport>)>,
        coalescing: ProduceCoalescing,
    ) -> Self {
        let nodes: Vec<Node> = nodes
            .into_iter()
            .map(|(address, client)| Node {
                produces: Arc::new(Coalescer::new(client.clone(), coalescing)),
                address,
                client,
            })
            .collect();
        let first = std::process::id() as usize;
        Self {
            health: Mutex::new(NodeHealth::new(nodes.len(), first)),
            nodes,
            leaders: Mutex::default(),
        }
    }

    /// The same nodes, folding produces under `coalescing`; no route is kept.
    pub(crate) fn with_coalescing(&self, coalescing: ProduceCoalescing) -> Self {
        let nodes = self
            .nodes
            .iter()
            .map(|node| (node.address.clone(), node.client.clone()))
            .collect();
        Self::new(nodes, coalescing)
    }

    fn leaders(&self) -> MutexGuard<'_, Leaders> {
        self.leaders.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn health(&self) -> MutexGuard<'_, NodeHealth> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn chosen(&self, index: usize) -> ChosenNode {
        ChosenNode {
            index,
            produces: self.nodes[index].produces.clone(),
        }
    }

    /// The node `producer`'s produces go to: the one last known to lead
    /// it, or to forward to its leader, if any.
    pub(crate) fn leader(&self, queue: &str, producer: &str) -> Option<ChosenNode> {
        let node = *self.leaders().by_queue.get(queue)?.get(producer)?;
        Some(self.chosen(node))
    }

    /// The node whose turn it is, for a producer with no route, passing
    /// over nodes whose call failed a moment ago.
    pub(crate) fn any_node(&self, now: Instant) -> ChosenNode {
        let index = self.health().pick(now);
        self.chosen(index)
    }

    /// A call to node `index` failed in transport or found no leader at `now`.
    pub(crate) fn failed(&self, index: usize, now: Instant) {
        self.health().failed(index, now);
    }

    /// Remembers that `leader_address` led `producer`'s shard, as node
    /// `answered_by` answered; when the leader is not one of the client's
    /// nodes, the producer's produces go on to `answered_by`, which
    /// forwards them. An answer naming no leader forgets the route.
    pub(crate) fn learn(
        &self,
        queue: &str,
        producer: &str,
        leader_address: &str,
        answered_by: usize,
    ) {
        self.health().answered(answered_by);
        let leader_address = host_port(leader_address);
        if leader_address.is_empty() {
            self.forget(queue, producer);
            return;
        }
        let node = self
            .nodes
            .iter()
            .position(|node| node.address == leader_address)
            .unwrap_or(answered_by);
        let mut leaders = self.leaders();
        if leaders.by_queue.get(queue).and_then(|p| p.get(producer)) == Some(&node) {
            return;
        }
        if leaders.remembered >= MAX_ROUTES {
            *leaders = Leaders::default();
        }
        let previous = leaders
            .by_queue
            .entry(queue.to_owned())
            .or_default()
            .insert(producer.to_owned(), node);
        if previous.is_none() {
            leaders.remembered += 1;
        }
    }

    /// Drops `producer`'s route: its next produce goes through any node.
    pub(crate) fn forget(&self, queue: &str, producer: &str) {
        let mut leaders = self.leaders();
        let Some(producers) = leaders.by_queue.get_mut(queue) else {
            return;
        };
        if producers.remove(producer).is_some() {
            if producers.is_empty() {
                leaders.by_queue.remove(queue);
            }
            leaders.remembered -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(addresses: &[&str]) -> Routes {
        let nodes = addresses
            .iter()
            .map(|address| {
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                    .expect("valid address")
                    .connect_lazy();
                let bearer = crate::bearer::Bearer::new(None).expect("no token");
                (
                    (*address).to_owned(),
                    FloretClient::with_interceptor(channel, bearer),
                )
            })
            .collect();
        Routes::new(nodes, ProduceCoalescing::default())
    }

    fn routed_to(routes: &Routes, producer: &str) -> Option<usize> {
        routes.leader("q", producer).map(|node| node.index)
    }

    #[tokio::test]
    async fn produce_sent_to_a_node_the_client_was_not_given() {
        let routes = routes(&["127.0.0.1:7701", "127.0.0.1:7702"]);
        routes.learn("q", "p", "http://127.0.0.1:7702/", 0);
        assert_eq!(routed_to(&routes, "p"), Some(1));
        assert_eq!(routed_to(&routes, "other"), None);
        routes.learn("q", "p", "10.0.0.9:7702", 0);
        assert_eq!(
            routed_to(&routes, "p"),
            Some(0),
            "a leader the client cannot dial is reached through the node that answered"
        );
        routes.learn("q", "p", "", 1);
        assert_eq!(routed_to(&routes, "p"), None);
    }

    #[tokio::test]
    async fn route_table_grows_without_bound() {
        let routes = routes(&["127.0.0.1:7701"]);
        for producer in 0..MAX_ROUTES + 10 {
            routes.learn("q", &producer.to_string(), "127.0.0.1:7701", 0);
        }
        assert!(routes.leaders().remembered <= MAX_ROUTES);
        routes.forget("q", &(MAX_ROUTES + 9).to_string());
        routes.forget("q", "never-routed");
        let leaders = routes.leaders();
        let counted: usize = leaders.by_queue.values().map(HashMap::len).sum();
        assert_eq!(counted, leaders.remembered);
    }
}
