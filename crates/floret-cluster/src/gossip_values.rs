//! The values a node publishes in the gossip view about its load, and their
//! short text forms (`p=3;w=3;m=120;b=15360;r=512.5;c=1`), which keep a
//! node's whole state within a datagram or two. A field that cannot be read
//! is skipped, so nodes of different versions still read each other.

use floret_store::ShardId;

/// One queue's load on one node, as the dispatcher of its led shards sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueLoad {
    /// Producers with undelivered messages.
    pub backlogged_producers: u64,
    /// Sum of their weights: what the node's share of a consumer follows.
    pub backlogged_weight: u64,
    /// Messages stored and not acked (in flight included).
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Deliveries per second, recently.
    pub dispatch_rate: f64,
    /// Consumer streams on this node.
    pub consumers: u64,
}

impl QueueLoad {
    pub(crate) fn encode(&self) -> String {
        format!(
            "p={};w={};m={};b={};r={:.1};c={}",
            self.backlogged_producers,
            self.backlogged_weight,
            self.messages,
            self.bytes,
            self.dispatch_rate,
            self.consumers
        )
    }

    pub(crate) fn decode(text: &str) -> Self {
        let mut load = Self::default();
        for field in text.split(';') {
            let Some((name, value)) = field.split_once('=') else {
                continue;
            };
            match name {
                "p" => load.backlogged_producers = value.parse().unwrap_or(0),
                "w" => load.backlogged_weight = value.parse().unwrap_or(0),
                "m" => load.messages = value.parse().unwrap_or(0),
                "b" => load.bytes = value.parse().unwrap_or(0),
                "r" => load.dispatch_rate = value.parse().unwrap_or(0.0),
                "c" => load.consumers = value.parse().unwrap_or(0),
                _ => {}
            }
        }
        load
    }
}

/// What one tenant with limits in a queue holds in the shards a node leads,
/// and how fast it asks that node to store more.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantLoad {
    /// Messages produced into the node per second recently, admitted or not.
    pub demand: f64,
    /// Per shard led there: the tenant's stored messages and bytes.
    pub shards: Vec<(ShardId, u64, u64)>,
}

impl TenantLoad {
    pub(crate) fn encode(&self) -> String {
        let shards: Vec<String> = self
            .shards
            .iter()
            .map(|(shard, messages, bytes)| format!("{shard}:{messages}:{bytes}"))
            .collect();
        format!("d={:.1};s={}", self.demand, shards.join(","))
    }

    pub(crate) fn decode(text: &str) -> Self {
        let mut load = Self::default();
        for field in text.split(';') {
            match field.split_once('=') {
                Some(("d", value)) => load.demand = value.parse().unwrap_or(0.0),
                Some(("s", value)) => {
                    load.shards = value
                        .split(',')
                        .filter_map(|shard| {
                            let mut parts = shard.split(':').map(str::parse::<u64>);
                            match (parts.next(), parts.next(), parts.next()) {
                                (Some(Ok(shard)), Some(Ok(messages)), Some(Ok(bytes))) => {
                                    Some((ShardId::try_from(shard).ok()?, messages, bytes))
                                }
                                _ => None,
                            }
                        })
                        .collect();
                }
                _ => {}
            }
        }
        load
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_load_survives_its_text_form() {
        let load = QueueLoad {
            backlogged_producers: 3,
            backlogged_weight: 5,
            messages: 120,
            bytes: 15_360,
            dispatch_rate: 512.5,
            consumers: 1,
        };
        assert_eq!(QueueLoad::decode(&load.encode()), load);
        assert_eq!(
            QueueLoad::decode("w=2;junk;x=1"),
            QueueLoad {
                backlogged_weight: 2,
                ..QueueLoad::default()
            }
        );
    }

    #[test]
    fn tenant_load_survives_its_text_form_and_skips_what_it_cannot_read() {
        let load = TenantLoad {
            demand: 250.5,
            shards: vec![(3, 120, 15_360), (17, 1, 40)],
        };
        assert_eq!(TenantLoad::decode(&load.encode()), load);
        let idle = TenantLoad::default();
        assert_eq!(TenantLoad::decode(&idle.encode()), idle);
        assert_eq!(
            TenantLoad::decode("s=4:x:1,5:2:20;junk"),
            TenantLoad {
                demand: 0.0,
                shards: vec![(5, 2, 20)],
            }
        );
    }
}
