//! The member list as this node's replica of the membership group holds
//! it: the voters and learners of the group's configuration with their
//! peer addresses, and the placement epoch (the log index of that
//! configuration, which grows with every change of members).
//!
//! IMPLEMENTATION CAVEATS
//! - It is the configuration this replica acts on, the latest it holds,
//!   which may not be committed yet; nothing changes it yet, so it is the
//!   founding members.
//! - A node's client address is not in it: the gossip view carries those.

use std::collections::BTreeSet;

use floret_store::NodeId;

use super::{MEMBERSHIP_GROUP, Shards};

/// One member, as the membership group holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub id: NodeId,
    /// Where the other nodes dial it.
    pub peer_address: String,
    /// Whether it votes in the membership group (learners follow it).
    pub voter: bool,
}

/// The member list at one epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembersView {
    /// The log index of the configuration (the founding one is 0); None
    /// before the group is founded.
    pub epoch: Option<u64>,
    /// The membership group's leader, as this replica knows it.
    pub leader: Option<NodeId>,
    /// The members, in id order.
    pub members: Vec<Member>,
}

impl Shards {
    /// The member list as this node's replica of the membership group holds it.
    pub fn members_view(&self) -> MembersView {
        let metrics = self.groups[&MEMBERSHIP_GROUP]
            .raft
            .metrics()
            .borrow()
            .clone();
        let stored = &metrics.membership_config;
        let voters: BTreeSet<NodeId> = stored.membership().voter_ids().collect();
        MembersView {
            epoch: stored.log_id().map(|log_id| log_id.index),
            leader: metrics.current_leader,
            members: stored
                .membership()
                .nodes()
                .map(|(&id, node)| Member {
                    id,
                    peer_address: node.addr.clone(),
                    voter: voters.contains(&id),
                })
                .collect(),
        }
    }
}
