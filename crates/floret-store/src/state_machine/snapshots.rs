//! Snapshot images of one shard's state machine: how large one should come
//! to, building one from the image captured between two applies (and
//! saving it to the shard's snapshot file), and making the tree an image's
//! state (an install from the leader, or the shard's own snapshot at
//! start). When openraft asks for which is `mod.rs`.

use openraft::{RaftSnapshotBuilder, Snapshot};
use std::io::Cursor;

use crate::blocking::off_the_runtime;
use crate::keys;
use crate::reader::ShardReader;
use crate::records::{AppliedState, encode};
use crate::snapshot::{EncodedImage, SnapshotFile, SnapshotMeta, TreeImage};
use crate::storage_error;
use crate::types::{ShardId, StorageError, TypeConfig};
use crate::wal::SegmentRuns;

/// What a shard's snapshot image should come to: its messages stored
/// inline, with room for run headers, producer records and the rest.
pub(super) fn expected_image_bytes(reader: &ShardReader) -> usize {
    let totals = reader.totals();
    let bytes = totals.bytes() + 8 * totals.messages() + 256 * totals.producers() + (1 << 20);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// Makes `shard`'s tree the snapshot image `data` with the applied state
/// `meta` names: an install from the leader, or a node catching up with its
/// own snapshot at start.
pub(super) fn replace_tree_with_image(
    shard: ShardId,
    reader: &ShardReader,
    meta: &SnapshotMeta,
    data: &[u8],
) -> Result<(), StorageError> {
    let signature = Some(meta.signature());
    let mut image = TreeImage::from_bytes(data)
        .map_err(|e| storage_error::read_snapshot(signature.clone(), &e))?;
    image.drop_node_local_keys();
    image
        .validate()
        .map_err(|e| storage_error::read_snapshot(signature, &std::io::Error::other(e)))?;
    let applied = encode(&AppliedState {
        last_applied: meta.last_log_id,
        membership: meta.last_membership.clone(),
    });
    reader
        .tree()
        .replace_all(
            image
                .pairs
                .into_iter()
                .chain([(keys::APPLIED.to_vec(), applied)]),
        )
        .map_err(storage_error::write_state_machine)?;
    reader.log().set_pins(shard, SegmentRuns::new());
    reader.reload()
}

/// Builds a snapshot from the tree image taken when openraft asked for the
/// builder (between two applies, so the image matches its applied log id).
pub struct SnapshotBuilder {
    pub(super) image: Result<EncodedImage, StorageError>,
    pub(super) applied: Result<AppliedState, StorageError>,
    pub(super) file: SnapshotFile,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let image = std::mem::take(self.image.as_mut().map_err(|e| e.clone())?);
        let applied = self.applied.clone()?;
        let snapshot_id = match applied.last_applied {
            Some(log_id) => format!("{}-{}-{}", log_id.leader_id, log_id.index, image.pairs),
            None => format!("empty-{}", image.pairs),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership,
            snapshot_id,
        };
        let file = self.file.clone();
        let saved_meta = meta.clone();
        let data =
            off_the_runtime(move || file.save(&saved_meta, &image.bytes).map(|()| image.bytes))
                .await
                .and_then(|saved| saved)
                .map_err(|e| storage_error::write_snapshot(Some(meta.signature()), &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}
