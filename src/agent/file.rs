//! Reading one file under the root for the gateway (a plugin's `.mcp.json`): a regular file,
//! bounded in size, streamed in chunks; it never reads past `max_bytes`. Its refusals and
//! failures carry their class (`tunnel::Refusal`), so the gateway can tell them apart.

use std::path::Path;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::io::MessageSink;
use super::serve::io_refusal;
use crate::tunnel::Refusal;

/// The largest Data frame a file is sent in.
pub const CHUNK: usize = 64 * 1024;

/// A file checked and open, ready to be streamed.
pub struct FileServer {
    file: tokio::fs::File,
    uri: String,
    max_bytes: u64,
}

impl FileServer {
    /// `path` is already contained in the root, symlinks resolved. The reason of an `Err`
    /// carries its [`Refusal`] class.
    pub(super) async fn open(path: &Path, uri: &str, max_bytes: u64) -> Result<Self, String> {
        let not_a_file = || Refusal::NotAFile.tag(&format!("{uri} is not a regular file"));
        // Opening a named pipe waits for a writer, which may never come: only what looks like
        // a regular file now is opened at all.
        let before = tokio::fs::metadata(path).await.map_err(|e| io_refusal(&e).tag(&format!("{uri}: {e}")))?;
        if !before.is_file() {
            return Err(not_a_file());
        }
        let file = tokio::fs::File::open(path).await.map_err(|e| io_refusal(&e).tag(&format!("{uri}: {e}")))?;
        // Checked again on the open file, so a swap after the check does not change what is read.
        let meta = file.metadata().await.map_err(|e| Refusal::Unreadable.tag(&format!("{uri}: {e}")))?;
        if !meta.is_file() {
            return Err(not_a_file());
        }
        if meta.len() > max_bytes {
            return Err(
                Refusal::TooLarge.tag(&format!("{uri} has {} bytes, over the limit of {max_bytes}", meta.len()))
            );
        }
        Ok(Self { file, uri: uri.to_owned(), max_bytes })
    }

    pub(super) async fn run(self, sink: impl MessageSink, stop: CancellationToken) {
        super::io::stream_until_stopped(sink, stop, async |sink| self.stream(sink).await).await;
    }

    /// Sends the file; the close reason (empty when all of it was sent).
    async fn stream(self, sink: &impl MessageSink) -> String {
        let Self { file, uri, max_bytes } = self;
        // One byte past the limit is read so a file that grew since the check is caught.
        let mut limited = file.take(max_bytes.saturating_add(1));
        let mut sent: u64 = 0;
        loop {
            let mut chunk = vec![0u8; CHUNK];
            let n = match limited.read(&mut chunk).await {
                Ok(0) => return String::new(),
                Ok(n) => n,
                Err(e) => return Refusal::Unreadable.tag(&format!("reading {uri}: {e}")),
            };
            sent += n as u64;
            if sent > max_bytes {
                return Refusal::TooLarge
                    .tag(&format!("{uri} grew over the limit of {max_bytes} bytes while being read"));
            }
            chunk.truncate(n);
            if let Err(e) = sink.send(Bytes::from(chunk)).await {
                return format!("sending {uri}: {e}");
            }
        }
    }
}
