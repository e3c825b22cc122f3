//! No decoder of what a peer or a client sends panics: raft messages and
//! proposed operations (postcard, from the peer port) and delivery ids
//! (from acks), fed arbitrary input, answer with a value or an error, and
//! the checks on decoded raft messages (`raft_inputs.rs`) answer too.
//! 10,000 cases per property in `cargo test`; a long run sets
//! `PROPTEST_CASES=1000000`.

use floret_cluster::decode;
use floret_store::{NodeId, Op, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use proptest::prelude::*;

use crate::delivery_id::DeliveryTicket;
use crate::raft_inputs::{self, SnapshotChunks};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig::with_cases(cases)
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(any::<u8>(), 0..1024),
        proptest::collection::vec(
            prop_oneof![Just(0u8), Just(1), Just(0xff), Just(0x80)],
            0..256
        ),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn peer_message_decoders_never_panic(payload in bytes()) {
        if let Ok(vote) = decode::<VoteRequest<NodeId>>(&payload) {
            let _ = raft_inputs::check_vote_request(&vote);
        }
        if let Ok(append) = decode::<AppendEntriesRequest<TypeConfig>>(&payload) {
            let _ = raft_inputs::check_append(&append);
        }
        if let Ok(chunk) = decode::<InstallSnapshotRequest<TypeConfig>>(&payload) {
            let _ = SnapshotChunks::new(1 << 20).admit(0, &chunk, floret_store::check_image);
        }
        let _ = decode::<Op>(&payload);
    }

    #[test]
    fn delivery_id_parser_never_panics(text in ".{0,80}", digits in "[0-9-]{0,40}[a-z]{0,8}") {
        let _ = text.parse::<DeliveryTicket>();
        let _ = digits.parse::<DeliveryTicket>();
    }
}
