//! Reading files a user names — models, `.npy` inputs, weights, states, artifact files — without trusting them:
//! only regular files are read (a device such as `/dev/zero`, a FIFO or a directory is refused by name instead of
//! read until memory runs out), the buffer is reserved fallibly for the size the file system reports (an error
//! saying how many bytes it needs, never an allocation abort), and at most that many bytes are read (a file that
//! grows meanwhile does not grow the buffer). Every crate that reads user files goes through here.

use std::io::Read;
use std::path::Path;

/// Reads the regular file at `path` (see the module docs). Errors are `io::Error`s whose message says what is
/// wrong; callers name the path.
pub fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let what = if meta.is_dir() { "a directory" } else { "not a regular file (a device, FIFO or socket)" };
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{what}, not a file kiln reads")));
    }
    let len = meta.len();
    let mut bytes = Vec::new();
    usize::try_from(len).ok().and_then(|n| bytes.try_reserve_exact(n).ok()).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("reading it needs {len} bytes of memory"))
    })?;
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// [`read_file`] as UTF-8 text.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_file(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_read_and_others_are_refused() {
        let dir = std::env::temp_dir().join(format!("kiln-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.bin");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(read_file(&f).unwrap(), b"abc");
        assert_eq!(read_text(&f).unwrap(), "abc");
        assert!(read_file(&dir).unwrap_err().to_string().contains("a directory"));
        #[cfg(unix)]
        assert!(read_file(Path::new("/dev/zero")).unwrap_err().to_string().contains("not a regular file"));
        std::fs::write(&f, [0xff, 0xfe]).unwrap();
        assert!(read_text(&f).unwrap_err().to_string().contains("not UTF-8"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
