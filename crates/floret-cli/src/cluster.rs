//! `floret cluster`: changes of members. `add-node` makes a node a member
//! (start it with `--join` before or after), `remove-node` takes one out,
//! alive or dead, and `replace-node` puts a new node in a member's seat,
//! so it takes exactly that member's shards; each prints the members once
//! the change is committed, and the shards then move. `moves` lists the shards whose replicas are
//! not yet where the members place them, with each new replica's lag.

use floret_client::ClusterStatusResponse;

use crate::DEFAULT_ADDRESS;
use crate::table::{Align, Table};

#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Make a node a member; the shards the ring gives it move to it.
    AddNode {
        /// The new node's id (its --node-id).
        #[arg(long)]
        id: u64,
        /// Where the other nodes dial it: its peer port, host:port.
        #[arg(long)]
        peer_addr: String,
        /// A member to ask.
        #[arg(long, default_value = DEFAULT_ADDRESS)]
        addr: String,
    },
    /// Take a member out, alive or dead; its shards move to the others.
    RemoveNode {
        /// The member's id.
        id: u64,
        /// A member to ask.
        #[arg(long, default_value = DEFAULT_ADDRESS)]
        addr: String,
    },
    /// Replace a member, alive or dead, by a new node (a new id, an empty
    /// data dir) that takes exactly its shards; start the new node with
    /// --join.
    ReplaceNode {
        /// The member replaced.
        id: u64,
        /// The new node's id (its --node-id).
        #[arg(long)]
        with: u64,
        /// Where the other nodes dial the new node: its peer port, host:port.
        #[arg(long)]
        peer_addr: String,
        /// A member to ask.
        #[arg(long, default_value = DEFAULT_ADDRESS)]
        addr: String,
    },
    /// The shards moving to their new replicas, with the new replicas' lag.
    Moves {
        /// A member to ask.
        #[arg(long, default_value = DEFAULT_ADDRESS)]
        addr: String,
    },
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let membership = match args.command {
        ClusterCommand::AddNode {
            id,
            peer_addr,
            addr,
        } => crate::dial(&addr)?.add_node(id, &peer_addr).await?,
        ClusterCommand::RemoveNode { id, addr } => crate::dial(&addr)?.remove_node(id).await?,
        ClusterCommand::ReplaceNode {
            id,
            with,
            peer_addr,
            addr,
        } => {
            crate::dial(&addr)?
                .replace_node(id, with, &peer_addr)
                .await?
        }
        ClusterCommand::Moves { addr } => {
            let status = crate::dial(&addr)?.cluster_status().await?;
            println!(
                "{}",
                crate::status::members_line(status.membership.as_ref())
            );
            println!("{}", moves(&status));
            return Ok(());
        }
    };
    println!("{}", crate::status::members_line(Some(&membership)));
    Ok(())
}

/// The shards of `status` whose voters are not where their leader places
/// them, or that have learners: from which replicas to which, and how far
/// behind each replica that is not a voter yet is. "no shard is moving"
/// when there is none.
fn moves(status: &ClusterStatusResponse) -> String {
    let ids = |nodes: &[u64]| {
        let mut nodes = nodes.to_vec();
        nodes.sort_unstable();
        nodes
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut table = Table::new(&[
        ("shard", Align::Right),
        ("leader", Align::Right),
        ("from", Align::Left),
        ("to", Align::Left),
        ("new replicas (node:lag)", Align::Left),
    ]);
    let mut moving = 0;
    for shard in &status.shards {
        if ids(&shard.voters) == ids(&shard.placed) && shard.learners.is_empty() {
            continue;
        }
        moving += 1;
        let new_replicas: Vec<String> = shard
            .placed
            .iter()
            .filter(|node| !shard.voters.contains(node))
            .map(|&node| {
                let lag = shard
                    .replicas
                    .iter()
                    .find(|replica| replica.node_id == node && replica.reachable)
                    .map_or("?".to_owned(), |replica| replica.lag.to_string());
                format!("{node}:{lag}")
            })
            .collect();
        table.row(vec![
            shard.shard_id.to_string(),
            shard.leader_id.to_string(),
            ids(&shard.voters),
            ids(&shard.placed),
            new_replicas.join(" "),
        ]);
    }
    if moving == 0 {
        return "no shard is moving".to_owned();
    }
    format!(
        "{moving} of {} shards moving\n{}",
        status.shards.len(),
        table.render("")
    )
}

#[cfg(test)]
mod tests {
    use floret_client::ClusterStatusResponse;
    use floret_proto::v1::{ReplicaStatus, ShardStatus};

    use super::moves;

    fn shard(id: u32, voters: &[u64], learners: &[u64], placed: &[u64]) -> ShardStatus {
        ShardStatus {
            shard_id: id,
            leader_id: voters[0],
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            placed: placed.to_vec(),
            replicas: voters
                .iter()
                .chain(learners)
                .map(|&node| ReplicaStatus {
                    node_id: node,
                    reachable: true,
                    applied_index: 10,
                    lag: if learners.contains(&node) { 90 } else { 0 },
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_shard_moving_to_a_new_node_shows_its_catching_up_replica() {
        let status = ClusterStatusResponse {
            shards: vec![
                shard(0, &[1, 2, 3], &[], &[1, 2, 3]),
                shard(1, &[1, 2, 3], &[4], &[1, 3, 4]),
                shard(2, &[2, 3, 1], &[], &[2, 3, 5]),
            ],
            ..Default::default()
        };
        let listed = moves(&status);
        assert!(listed.starts_with("2 of 3 shards moving"), "{listed}");
        assert!(listed.contains("1,2,3  1,3,4  4:90"), "{listed}");
        assert!(listed.contains("1,2,3  2,3,5  5:?"), "{listed}");
        assert!(!listed.contains("\n    0"), "{listed}");
    }

    #[test]
    fn settled_shards_say_so() {
        let status = ClusterStatusResponse {
            shards: vec![shard(0, &[1, 2, 3], &[], &[3, 2, 1])],
            ..Default::default()
        };
        assert_eq!(moves(&status), "no shard is moving");
    }
}
