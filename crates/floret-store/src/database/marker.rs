//! The format marker that tells a floret data dir from anything else: a
//! new data dir gets one, an existing one must carry this build's format.

use std::fs;
use std::io;
use std::path::Path;

use super::OpenError;

/// Name of the marker file written into every floret data dir.
pub const MARKER_FILE: &str = "FLORET";
/// Version of the on-disk layout this build reads and writes.
pub const FORMAT_VERSION: u32 = 4;

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
            fs::write(&marker, format!("format {FORMAT_VERSION}\n")).map_err(io_error)?;
            fs::File::open(&marker)
                .and_then(|f| f.sync_all())
                .map_err(io_error)?;
            fs::File::open(dir)
                .and_then(|f| f.sync_all())
                .map_err(io_error)?;
            Ok(true)
        }
        Err(error) => Err(io_error(error)),
    }
}
