//! The cluster's gossip in a run: every node is started with the
//! `gossip-send-drop` fault point tied to one file under the run's root, so
//! a schedule (or the whole run) cuts every node's gossip datagrams by
//! creating it and heals by deleting it; and the check that the view is
//! complete (every node sees every other alive) before faults begin.
//!
//! Gossip itself goes straight between the nodes over UDP, not through the
//! peer links' TCP proxies: each node learns the others' gossip addresses
//! over the peer API (through the proxies) and introduces itself there.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use super::{Cluster, NodeId};
use crate::process::poll;

impl Cluster {
    /// The file whose existence cuts every node's gossip.
    fn gossip_cut_file(&self) -> PathBuf {
        self.spec.root.join("gossip-cut")
    }

    /// `failpoints` with the gossip cut added, for a node's `FAILPOINTS`.
    pub(super) fn with_gossip_cut(&self, failpoints: &str) -> String {
        let cut = format!(
            "gossip-send-drop=return({})",
            self.gossip_cut_file().display()
        );
        if failpoints.is_empty() {
            cut
        } else {
            format!("{failpoints};{cut}")
        }
    }

    /// Whether the run cuts gossip from start to end.
    pub fn gossip_cut_throughout(&self) -> bool {
        self.spec.gossip_cut
    }

    /// Cuts (or restores) every node's gossip, whatever else happens.
    pub fn set_gossip_cut(&self, cut: bool) -> anyhow::Result<()> {
        let file = self.gossip_cut_file();
        if cut {
            std::fs::write(&file, b"")?;
        } else if file.exists() {
            std::fs::remove_file(&file)?;
        }
        Ok(())
    }

    /// Waits until every node's status shows every node alive in its view.
    pub async fn wait_for_full_view(&self, within: Duration) -> anyhow::Result<()> {
        let ids = self.ids();
        let complete = poll(within, Duration::from_millis(200), || async {
            for &id in &ids {
                let status = self.client(id).cluster_status().await.ok()?;
                let alive = status
                    .nodes
                    .iter()
                    .filter(|node| node.liveness == "alive")
                    .count();
                if alive < ids.len() {
                    return None;
                }
            }
            Some(())
        })
        .await;
        complete.with_context(|| {
            format!("the gossip view was not complete on every node within {within:?}")
        })
    }

    /// The nodes that warn in their status that they hear no gossip.
    pub async fn warning_of_gossip_silence(&self) -> Vec<NodeId> {
        let mut warning = Vec::new();
        for id in self.serving() {
            if let Ok(status) = self.client(id).cluster_status().await
                && status
                    .nodes
                    .iter()
                    .any(|node| node.node_id == id && !node.gossip_warning.is_empty())
            {
                warning.push(id);
            }
        }
        warning
    }
}
