//! Where a shard's current snapshot lives on disk: `snapshots/shard-N.snap`,
//! a header with openraft's snapshot metadata, then the encoded tree image.
//! Every save writes a temp file, syncs it and renames it over the old one,
//! so a crash leaves the old snapshot or the new one, never half of either.
//!
//! IMPLEMENTATION CAVEATS
//! - [`SnapshotFile::load`] reads the whole image into memory: sending a
//!   snapshot to a replica costs its size for a moment.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::SnapshotMeta;
use crate::records::{decode, encode};
use crate::types::ShardId;

/// Where one shard keeps its current snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    path: PathBuf,
    /// Held while a save writes the temp file: a build and an install can
    /// save at once, on two blocking threads.
    saving: Arc<Mutex<()>>,
}

#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    meta: SnapshotMeta,
}

impl SnapshotFile {
    /// The snapshot file of `shard` under `dir`.
    pub fn new(dir: &Path, shard: ShardId) -> Self {
        Self {
            path: dir.join(format!("shard-{shard}.snap")),
            saving: Arc::default(),
        }
    }

    /// Replaces the current snapshot, durably.
    pub fn save(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
        let _one_save_at_a_time = self.one_save_at_a_time();
        let (temp, mut file, _) = self.start_saving(meta)?;
        file.write_all(data)?;
        self.finish_saving(&temp, file.into_inner().map_err(|e| e.into_error())?)
    }

    fn one_save_at_a_time(&self) -> MutexGuard<'_, ()> {
        self.saving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens the temp file and writes the header; returns where the data starts.
    fn start_saving(&self, meta: &SnapshotMeta) -> io::Result<(PathBuf, BufWriter<File>, usize)> {
        let dir = self.path.parent().expect("snapshot path has a folder");
        fs::create_dir_all(dir)?;
        let header = encode(&SnapshotHeader { meta: meta.clone() });
        let temp = self.path.with_extension("snap.tmp");
        let mut file = BufWriter::new(File::create(&temp)?);
        file.write_all(&(header.len() as u32).to_be_bytes())?;
        file.write_all(&header)?;
        Ok((temp, file, 4 + header.len()))
    }

    /// Syncs the temp file and puts it in place of the current snapshot.
    fn finish_saving(&self, temp: &Path, file: File) -> io::Result<()> {
        file.sync_all()?;
        fs::rename(temp, &self.path)?;
        let dir = self.path.parent().expect("snapshot path has a folder");
        File::open(dir)?.sync_all()
    }

    /// Deletes the snapshot (and a save a crash left half done), durably.
    pub fn delete(&self) -> io::Result<()> {
        let _no_save_meanwhile = self.one_save_at_a_time();
        let mut deleted = false;
        for path in [self.path.with_extension("snap.tmp"), self.path.clone()] {
            match fs::remove_file(&path) {
                Ok(()) => deleted = true,
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        if deleted {
            let dir = self.path.parent().expect("snapshot path has a folder");
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// The current snapshot, if one was saved.
    pub fn load(&self) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let corrupt = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is truncated", self.path.display()),
            )
        };
        let header_len = bytes.get(..4).ok_or_else(corrupt)?;
        let header_len = u32::from_be_bytes(header_len.try_into().expect("four bytes")) as usize;
        let header = bytes.get(4..4 + header_len).ok_or_else(corrupt)?;
        let header: SnapshotHeader = decode("snapshot header", header).map_err(io::Error::other)?;
        let meta = header.meta;
        let mut data = bytes;
        data.drain(..4 + header_len);
        Ok(Some((meta, data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_snapshot_loads_as_it_was_saved_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = SnapshotFile::new(dir.path(), 3);
        assert!(file.load().unwrap().is_none());
        let data = vec![7u8; 70_000];
        let meta = SnapshotMeta::default();
        file.save(&meta, &data).unwrap();
        assert_eq!(file.load().unwrap().unwrap(), (meta, data));
        assert!(!dir.path().join("shard-3.snap.tmp").exists());
        file.delete().unwrap();
        assert!(file.load().unwrap().is_none());
    }
}
