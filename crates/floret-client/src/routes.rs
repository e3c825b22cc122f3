//! Where a producer's produces go: straight to the node that leads its
//! shard, once a produce answer has named it (`ProduceResponse.leader_address`),
//! so the cluster does not forward the call to the leader, one hop more.
//!
//! Only the nodes the client was given are used: an address a node
//! advertises to its peers may not be reachable from the client. A route
//! is a hint. A node that no longer leads the shard forwards the call and
//! its answer names the new leader. A call to it that fails in transport or
//! finds the shard without a leader (UNAVAILABLE and the like, not a
//! throttle or a refusal of the request) drops the route, so the next one
//! goes through the balanced channel over every node.
//!
//! IMPLEMENTATION CAVEATS
//! - At most [`MAX_ROUTES`] producers are remembered; past that the table
//!   starts over (the next produce of each goes through any node again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::Transport;
use floret_proto::v1::floret_client::FloretClient;

use crate::coalesce::{Coalescer, ProduceCoalescing};

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
        let nodes = nodes
            .into_iter()
            .map(|(address, client)| Node {
                produces: Arc::new(Coalescer::new(client.clone(), coalescing)),
                address,
                client,
            })
            .collect();
        Self {
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

    /// The produce calls of the node last known to lead `producer`, if it
    /// is one of the client's nodes.
    pub(crate) fn leader(&self, queue: &str, producer: &str) -> Option<Arc<Coalescer>> {
        let node = *self.leaders().by_queue.get(queue)?.get(producer)?;
        Some(self.nodes[node].produces.clone())
    }

    /// Remembers that `leader_address` led `producer`'s shard (or forgets
    /// the producer's route when that node is not one of the client's).
    pub(crate) fn learn(&self, queue: &str, producer: &str, leader_address: &str) {
        let leader_address = host_port(leader_address);
        let Some(node) = self
            .nodes
            .iter()
            .position(|node| node.address == leader_address)
        else {
            self.forget(queue, producer);
            return;
        };
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

    #[tokio::test]
    async fn produce_sent_to_a_node_the_client_was_not_given() {
        let routes = routes(&["127.0.0.1:7701", "127.0.0.1:7702"]);
        routes.learn("q", "p", "http://127.0.0.1:7702/");
        assert!(routes.leader("q", "p").is_some());
        assert!(routes.leader("q", "other").is_none());
        routes.learn("q", "p", "10.0.0.9:7702");
        assert!(routes.leader("q", "p").is_none(), "unknown node kept");
        routes.learn("q", "p", "");
        assert!(routes.leader("q", "p").is_none());
    }

    #[tokio::test]
    async fn route_table_grows_without_bound() {
        let routes = routes(&["127.0.0.1:7701"]);
        for producer in 0..MAX_ROUTES + 10 {
            routes.learn("q", &producer.to_string(), "127.0.0.1:7701");
        }
        assert!(routes.leaders().remembered <= MAX_ROUTES);
        routes.forget("q", &(MAX_ROUTES + 9).to_string());
        routes.forget("q", "never-routed");
        let leaders = routes.leaders();
        let counted: usize = leaders.by_queue.values().map(HashMap::len).sum();
        assert_eq!(counted, leaders.remembered);
    }
}
