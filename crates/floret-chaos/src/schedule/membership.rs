//! The rounds of the `membership-change` schedule: nodes added, members
//! paused, removed, killed, wiped and replaced while the workload runs.

use std::time::Duration;

use anyhow::Context;

use crate::cluster::Cluster;

/// How long the shards may take to settle on their replicas after a
/// change of members.
const MOVE_DEADLINE: Duration = Duration::from_secs(90);

/// How long a member stays paused while shards move to a new node: past
/// the election timeout, so the shards it leads elect other leaders.
const PAUSE_WHILE_MOVING: Duration = Duration::from_secs(3);

/// One round of [`super::Schedule::MembershipChange`]: adds the next new node,
/// then takes out the lowest member other than node 1 (which the
/// workload's clients keep reaching): on even rounds paused while shards
/// move, then removed alive; on odd rounds killed mid-move, wiped, and
/// replaced by a new node in its seat.
pub(super) async fn change_members(
    round: u32,
    cluster: &mut Cluster,
    fault: &impl Fn(String, bool),
) -> anyhow::Result<Vec<String>> {
    let mut observed = Vec::new();
    let ids = cluster.ids();
    let new_node = cluster.unused_id();
    let victim = ids
        .iter()
        .copied()
        .find(|&id| id != 1)
        .context("no member to remove but node 1")?;
    fault(format!("add node {new_node}"), false);
    let began = tokio::time::Instant::now();
    cluster.add_member(new_node).await?;
    let (taking_out, taken_out_at) = if round.is_multiple_of(2) {
        fault(
            format!("pause node {victim} while shards move to node {new_node}"),
            true,
        );
        cluster.set_paused(victim, true).await?;
        tokio::time::sleep(PAUSE_WHILE_MOVING).await;
        cluster.set_paused(victim, false).await?;
        cluster.wait_for_placement(MOVE_DEADLINE).await?;
        observed.push(format!(
            "node {new_node} joined (node {victim} paused {PAUSE_WHILE_MOVING:?} meanwhile); shards settled in {:.1} s",
            began.elapsed().as_secs_f64()
        ));
        fault(format!("remove node {victim} (alive)"), true);
        let removing = tokio::time::Instant::now();
        cluster.remove_member(victim, MOVE_DEADLINE).await?;
        (format!("node {victim} removed alive"), removing)
    } else {
        let replacement = new_node + 1;
        fault(
            format!(
                "kill node {victim} while shards move, wipe it, and replace it by node {replacement}"
            ),
            true,
        );
        cluster.kill(victim).await;
        cluster.wipe(victim)?;
        let replacing = tokio::time::Instant::now();
        cluster
            .replace_member(victim, replacement, MOVE_DEADLINE)
            .await?;
        (
            format!("node {victim} (killed, wiped) replaced by node {replacement}"),
            replacing,
        )
    };
    cluster.wait_for_placement(MOVE_DEADLINE).await?;
    observed.push(format!(
        "{taking_out}; shards settled on {:?} in {:.1} s",
        cluster.ids(),
        taken_out_at.elapsed().as_secs_f64()
    ));
    Ok(observed)
}
