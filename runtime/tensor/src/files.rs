//! Output files that are never half-written: write a temporary sibling, then rename. A file
//! that cannot be written is a [`WriteError`] naming it, with the system's reason as its source.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A file that could not be written. Shown as `cannot write PATH`, its source gives the reason.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}", .path.display())]
pub struct WriteError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Writes `bytes` to `path` atomically: readers see the old file or the whole new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// [`write_atomic`], its error naming the file.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    write_atomic(path, bytes).map_err(|source| WriteError {
        path: path.to_path_buf(),
        source,
    })
}
