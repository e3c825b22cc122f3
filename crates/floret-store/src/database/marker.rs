//! The format marker that tells a floret data dir from anything else: a
//! new data dir gets one, an existing one must carry this build's format
//! or one it reads and upgrades in place.

use std::fs;
use std::io;
use std::path::Path;

use super::OpenError;

/// Name of the marker file written into every floret data dir.
pub const MARKER_FILE: &str = "FLORET";
/// Version of the on-disk layout this build reads and writes. Format 5
/// stores most message runs packed (`runs/packed.rs`), which a format-4
/// build cannot read. Format 6 removes a message at its producer's head by
/// moving the head alone, without a removal mark (`runs/removed.rs`): a
/// format-5 build would take such messages for stored. Format 7 pads the
/// raft log to a page's end before each sync with a frame a format-6
/// build does not know (`wal/segment.rs`).
pub const FORMAT_VERSION: u32 = 7;

/// Older formats this build reads as they are: their data dirs are marked
/// with [`FORMAT_VERSION`] on open, so an older build no longer opens them.
const UPGRADED_FORMATS: [u32; 3] = [4, 5, 6];

/// Checks (or, for a new data dir, writes) the format marker; true when
/// the data dir was created.
pub(super) fn check_marker(dir: &Path) -> Result<bool, OpenError> {
    let io_error = |source| OpenError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let marker = dir.join(MARKER_FILE);
    match fs::read_to_string(&marker) {
        Ok(content) => {
            let found = content.trim();
            if found == format!("format {FORMAT_VERSION}") {
                Ok(false)
            } else if UPGRADED_FORMATS
                .iter()
                .any(|old| found == format!("format {old}"))
            {
                let upgraded = dir.join(format!("{MARKER_FILE}.upgrading"));
                write_durably(&upgraded)
                    .and_then(|()| fs::rename(&upgraded, &marker))
                    .and_then(|()| fs::File::open(dir)?.sync_all())
                    .map_err(io_error)?;
                tracing::info!(path = %dir.display(), from = found, "data dir upgraded to format {FORMAT_VERSION}");
                Ok(false)
            } else {
                Err(OpenError::UnknownFormat {
                    path: dir.to_path_buf(),
                    found: found.to_owned(),
                })
            }
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(io_error)?;
            if fs::read_dir(dir).map_err(io_error)?.next().is_some() {
                return Err(OpenError::NotFloret {
                    path: dir.to_path_buf(),
                });
            }
            write_durably(&marker).map_err(io_error)?;
            fs::File::open(dir)
                .and_then(|f| f.sync_all())
                .map_err(io_error)?;
            Ok(true)
        }
        Err(error) => Err(io_error(error)),
    }
}

/// Writes this build's marker to `path` and syncs it.
fn write_durably(path: &Path) -> io::Result<()> {
    fs::write(path, format!("format {FORMAT_VERSION}\n"))?;
    fs::File::open(path)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_format_data_dir_is_read_and_marked_so_an_older_build_refuses_it() {
        for old in ["format 4\n", "format 5\n", "format 6\n"] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(MARKER_FILE), old).unwrap();
            assert!(!check_marker(dir.path()).unwrap());
            let marker = fs::read_to_string(dir.path().join(MARKER_FILE)).unwrap();
            assert_eq!(marker.trim(), format!("format {FORMAT_VERSION}"));
            assert!(!check_marker(dir.path()).unwrap(), "opens again as it is");
        }
    }

    #[test]
    fn a_format_this_build_does_not_read_is_refused_untouched() {
        for found in ["format 3", "format 8", "something else"] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(MARKER_FILE), found).unwrap();
            assert!(matches!(
                check_marker(dir.path()),
                Err(OpenError::UnknownFormat { .. })
            ));
            assert_eq!(
                fs::read_to_string(dir.path().join(MARKER_FILE)).unwrap(),
                found
            );
        }
    }
}
