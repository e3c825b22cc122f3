//! floret's wire types: the `floret.v1` protobuf messages and the tonic
//! clients and servers of the `Floret` and `Admin` services, generated at build
//! time from `proto/floret/v1/` by protox (no system `protoc`).
//!
//! Only the gRPC edge (server services, client library) uses these types; the
//! scheduler and the store never see them.
//!
//! `sink::v1` is the service a queue's sink pushes to; floret is its client.
//!
//! `peer::v1` is the node-to-node service (raft traffic of every shard,
//! forwarded produces and settles, leadership hand-back, each node's own
//! dispatcher and figures); only the peer port serves it, and clients never
//! call it.

/// The `floret.v1` package: data plane (`Floret`) and inspection (`Admin`).
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("floret.v1");
}

/// The `floret.peer.v1` package: calls between the nodes of a cluster.
pub mod peer {
    /// Version 1; changes with the nodes, not with clients.
    pub mod v1 {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("floret.peer.v1");
    }
}

/// The `floret.sink.v1` package: the service a queue's sink pushes batches
/// to, implemented outside floret (or by `floret sink serve`).
pub mod sink {
    /// Version 1.
    pub mod v1 {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("floret.sink.v1");
    }
}

/// Encoded `FileDescriptorSet` of the public API (`floret.v1`), for gRPC
/// server reflection on the client port.
pub const PUBLIC_FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("floret_public_descriptor");
