//! The faults a schedule injects into a [`Cluster`]: nodes started armed
//! with fault points or expected to exit, SIGTERM, SIGSTOP/SIGCONT, cut and healed
//! peer links, and damage to a stopped node's data dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use super::{Cluster, NodeId};

impl Cluster {
    /// Starts node `id` with the fault points `failpoints` armed, without
    /// waiting for it to serve: a crash point may fire during start-up.
    pub async fn start_armed(&mut self, id: NodeId, failpoints: &str) -> anyhow::Result<()> {
        self.kill(id).await;
        self.spawn(id, failpoints)
    }

    /// Starts node `id` without waiting; for a start that is expected to fail.
    pub async fn start_expecting_exit(
        &mut self,
        id: NodeId,
        within: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        self.kill(id).await;
        self.spawn(id, "")?;
        let child = self
            .nodes
            .get_mut(&id)
            .and_then(|n| n.child.as_mut())
            .context("node not started")?;
        let exited = tokio::time::timeout(within, child.wait()).await;
        match exited {
            Ok(status) => {
                self.nodes.get_mut(&id).expect("known node").child = None;
                Ok(Some(status?))
            }
            Err(_) => Ok(None),
        }
    }

    /// Waits up to `within` for node `id` to exit by itself (a crash at a
    /// fault point); true when it did.
    pub async fn wait_for_exit(&mut self, id: NodeId, within: Duration) -> bool {
        let node = self.nodes.get_mut(&id).expect("known node");
        let Some(child) = node.child.as_mut() else {
            return true;
        };
        if tokio::time::timeout(within, child.wait()).await.is_ok() {
            node.child = None;
            return true;
        }
        false
    }

    /// SIGTERM of node `id`, the way an operator stops it; waits up to
    /// `within` for it to exit (it hands off the shards it leads first)
    /// and returns how long that took.
    pub async fn stop(&mut self, id: NodeId, within: Duration) -> anyhow::Result<Duration> {
        let node = self.nodes.get_mut(&id).expect("known node");
        let Some(child) = node.child.as_mut() else {
            bail!("node {id} is not running");
        };
        let pid = child.id().context("node already exited")?;
        let began = tokio::time::Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        let exited = tokio::time::timeout(within, child.wait())
            .await
            .with_context(|| format!("node {id} did not exit within {within:?} of SIGTERM"))??;
        node.child = None;
        if !exited.success() {
            bail!("node {id} exited with {exited} after SIGTERM");
        }
        Ok(began.elapsed())
    }

    /// SIGSTOP (`pause`) or SIGCONT of node `id`.
    pub async fn set_paused(&mut self, id: NodeId, pause: bool) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(&id).expect("known node");
        let Some(pid) = node.child.as_ref().and_then(Child::id) else {
            bail!("node {id} is not running");
        };
        let signal = if pause { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await?;
        if !status.success() {
            bail!("kill {signal} {pid} failed");
        }
        node.paused = pause;
        Ok(())
    }

    /// Cuts (or heals) the links from `from` to `to`.
    pub fn set_cut(&self, from: NodeId, to: NodeId, cut: bool) {
        self.links[&(from, to)].set_cut(cut);
    }

    /// Cuts node `id` off from every other node, both ways.
    pub fn isolate(&self, id: NodeId) {
        for (&(from, to), link) in &self.links {
            if from == id || to == id {
                link.set_cut(true);
            }
        }
    }

    /// Heals every link and gossip (unless the run cuts it throughout),
    /// resumes every paused node, and restarts every node that is down
    /// (without fault points).
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        for link in self.links.values() {
            link.set_cut(false);
        }
        self.set_gossip_cut(self.spec.gossip_cut)?;
        let mut down = Vec::new();
        for id in self.ids() {
            if self.nodes[&id].paused {
                self.set_paused(id, false).await?;
            }
            let exited = match self.nodes.get_mut(&id).and_then(|n| n.child.as_mut()) {
                Some(child) => child.try_wait()?.is_some(),
                None => true,
            };
            if exited {
                down.push(id);
            }
        }
        self.restart_all(&down, "").await
    }

    /// Deletes node `id`'s data dir (the node must be down).
    pub fn wipe(&self, id: NodeId) -> anyhow::Result<()> {
        let dir = self.data_dir(id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        Ok(())
    }

    /// The raft log segments of node `id`, oldest first.
    pub fn log_segments(&self, id: NodeId) -> anyhow::Result<Vec<PathBuf>> {
        let dir = self.data_dir(id).join("raft-log");
        let mut segments: Vec<PathBuf> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        segments.sort();
        Ok(segments)
    }
}

/// Flips one bit at `offset` of `file`.
pub fn flip_bit(file: &Path, offset: u64) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(file)?;
    let at = usize::try_from(offset)?.min(bytes.len().saturating_sub(1));
    bytes[at] ^= 0x04;
    std::fs::write(file, bytes)?;
    Ok(())
}
