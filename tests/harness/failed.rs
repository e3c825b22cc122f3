//! What a cluster leaves when its test fails: every node's log is copied
//! to a directory that outlives the test's temporary one, and the end of
//! each log is printed with the failure, so a failure seen only in CI can
//! be read afterwards.

use super::Cluster;

/// Lines printed from the end of each node's log.
const LOG_TAIL_LINES: usize = 30;

impl Drop for Cluster {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let kept = std::env::temp_dir().join(format!(
            "floret-failed-test-{}-{}",
            std::process::id(),
            self.root
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let _ = std::fs::create_dir_all(&kept);
        for id in 1..=self.ports.len() as u64 {
            let log = self.log(id);
            let _ = std::fs::write(kept.join(format!("node-{id}.log")), &log);
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            eprintln!(
                "--- the last lines of node {id}'s log ---\n{}",
                tail.join("\n")
            );
        }
        eprintln!("every node's log is kept in {}", kept.display());
    }
}
