//! Where a queue's dispatched messages are pushed, as every shard stores it:
//! the sink's target and how its batches close.
//!
//! The store keeps it and replicates it like a queue's policy; what the
//! values may be is checked where a request sets them (floret-server), and
//! the pumps that use it live there too.

use serde::{Deserialize, Serialize};

/// A queue's sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkSpec {
    /// Where batches go.
    pub target: SinkTarget,
    /// A batch closes once it holds this many messages.
    pub batch_max: u32,
    /// A batch closes before a message would take its payloads past this.
    pub batch_max_bytes: u64,
    /// A batch closes once its oldest message has waited this long, ms.
    pub linger_ms: u32,
    /// A batch the sink has not answered within this is retried, ms.
    pub timeout_ms: u32,
    /// Most messages a second the sink gets from the whole cluster; 0: no cap.
    pub rate: u32,
    /// Most batches the sink has from the whole cluster at once; 0: one
    /// per node.
    pub max_in_flight: u32,
}

/// The service a sink pushes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SinkTarget {
    /// A `floret.sink.v1.Sink` gRPC service at this URI (`http://host:port`).
    Grpc {
        /// The service's address.
        address: String,
    },
    /// An HTTP endpoint POSTed a JSON batch (`http://host:port/path`).
    Webhook {
        /// The endpoint.
        url: String,
    },
    /// An AMQP 0.9.1 broker, published to with publisher confirms.
    Amqp {
        /// `amqp://user:password@host:port/vhost`.
        uri: String,
        /// The exchange ("": the default one).
        exchange: String,
        /// The routing key, with `{producer}`, `{tenant}` and `{queue}`
        /// replaced by the message's.
        routing_key: String,
    },
}

/// A sink set on a queue, or removed from it (`sink` None).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetSink {
    /// The queue.
    pub queue: String,
    /// The sink; None removes the queue's sink.
    pub sink: Option<SinkSpec>,
}
