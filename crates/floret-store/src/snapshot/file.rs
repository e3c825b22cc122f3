//! Where a shard's current snapshot lives on disk: `snapshots/shard-N.snap`,
//! a header with openraft's snapshot metadata, then the encoded tree image.
//! Every save writes a temp file, syncs it and renames it over the old one,
//! so a crash leaves the old snapshot or the new one, never half of either.
//!
//! IMPLEMENTATION CAVEATS
//! - [`SnapshotFile::load`] reads the whole image into memory: sending a
//!   snapshot to a replica costs its size for a moment.

use std::fs::{self, File};
use std::io::{self, Read, Write};
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
        let dir = self.path.parent().expect("snapshot path has a folder");
        fs::create_dir_all(dir)?;
        let header = encode(&SnapshotHeader { meta: meta.clone() });
        let temp = self.path.with_extension("snap.tmp");
        let mut file = File::create(&temp)?;
        file.write_all(&(header.len() as u32).to_be_bytes())?;
        file.write_all(&header)?;
        file.write_all(data)?;
        file.sync_all()?;
        fs::rename(&temp, &self.path)?;
        File::open(dir)?.sync_all()
    }

    fn one_save_at_a_time(&self) -> MutexGuard<'_, ()> {
        self.saving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// The current snapshot's metadata, if one was saved, without reading
    /// its image.
    pub fn meta(&self) -> io::Result<Option<SnapshotMeta>> {
        Ok(self.open_at_image()?.map(|(meta, _, _)| meta))
    }

    /// The current snapshot, if one was saved. The header is read first, so
    /// the image is read once into a buffer of its own size.
    pub fn load(&self) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        let Some((meta, mut file, image_len)) = self.open_at_image()? else {
            return Ok(None);
        };
        let mut data = Vec::with_capacity(usize::try_from(image_len).unwrap_or(0));
        file.read_to_end(&mut data)?;
        Ok(Some((meta, data)))
    }

    /// The snapshot's metadata and its file, read up to where the image
    /// starts, with the image's length; None if no snapshot was saved.
    fn open_at_image(&self) -> io::Result<Option<(SnapshotMeta, File, u64)>> {
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let damaged = |reason: &dyn std::fmt::Display| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {reason}", self.path.display()),
            )
        };
        let truncated = || damaged(&"truncated");
        let file_len = file.metadata()?.len();
        if file_len < 4 {
            return Err(truncated());
        }
        let mut header_len = [0u8; 4];
        file.read_exact(&mut header_len)?;
        let header_len = u64::from(u32::from_be_bytes(header_len));
        let image_len = file_len.checked_sub(4 + header_len).ok_or_else(truncated)?;
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header)?;
        let header: SnapshotHeader =
            decode("snapshot header", &header).map_err(|error| damaged(&error))?;
        Ok(Some((header.meta, file, image_len)))
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
        assert_eq!(file.load().unwrap().unwrap(), (meta.clone(), data));
        assert_eq!(file.meta().unwrap(), Some(meta));
        assert!(!dir.path().join("shard-3.snap.tmp").exists());
        file.delete().unwrap();
        assert!(file.load().unwrap().is_none());
    }

    #[test]
    fn a_snapshot_file_cut_short_is_refused_as_truncated_not_read_past_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let file = SnapshotFile::new(dir.path(), 3);
        file.save(&SnapshotMeta::default(), &[7u8; 100]).unwrap();
        let path = dir.path().join("shard-3.snap");
        let saved = fs::read(&path).unwrap();
        for cut in [
            saved[..2].to_vec(),
            [u32::MAX.to_be_bytes().as_slice(), &saved[4..]].concat(),
        ] {
            fs::write(&path, &cut).unwrap();
            let refused = file.load().unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{refused}");
            assert!(refused.to_string().contains("truncated"), "{refused}");
        }
    }

    #[test]
    fn a_snapshot_header_that_does_not_decode_is_refused_as_damaged_data_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = SnapshotFile::new(dir.path(), 3);
        let path = dir.path().join("shard-3.snap");
        let damaged_header = [4u32.to_be_bytes().as_slice(), &[0xff; 4], &[7u8; 10]].concat();
        fs::write(&path, damaged_header).unwrap();
        let refused = file.load().unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{refused}");
        assert!(refused.to_string().contains("shard-3.snap"), "{refused}");
    }
}
