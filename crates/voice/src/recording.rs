//! Call recordings: once Twilio says a recording is `completed`, it is
//! downloaded (retried with backoff while Twilio is not ready) and saved as
//! `$LEMON_HOME/recordings/<YYYY-MM-DD>/<CallSid>_<RecordingSid>.wav`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::twilio::{RestError, TwilioRest};

/// Download attempts before giving up.
const ATTEMPTS: u32 = 5;
/// The wait after the first failed attempt; doubled after each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Whether `bytes` is a RIFF/WAVE file with a `fmt ` chunk.
pub fn is_wav(bytes: &[u8]) -> bool {
    bytes.len() >= 44
        && &bytes[0..4] == b"RIFF"
        && &bytes[8..12] == b"WAVE"
        && bytes.windows(4).take(256).any(|w| w == b"fmt ")
}

/// Why a recording was not saved.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordingError {
    #[error(transparent)]
    Rest(#[from] RestError),
    #[error("the recording could not be saved: {0}")]
    Save(String),
}

/// Downloads `recording_sid` of `call_sid` and saves it under `recordings`;
/// the file's path.
pub(crate) async fn download_and_save(
    rest: &TwilioRest,
    recordings: &Path,
    call_sid: &str,
    recording_sid: &str,
    date: &str,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<PathBuf, RecordingError> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    let wav = loop {
        match rest.download_recording(recording_sid).await {
            Ok(wav) => break wav,
            Err(err) if err.retryable() && attempt < ATTEMPTS => {
                tracing::debug!(call = %call_sid, attempt, error = %err, "recording not downloaded yet; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(err.into()),
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff *= 2;
                attempt += 1;
            }
            Err(err) => return Err(err.into()),
        }
    };
    save(recordings, date, &format!("{call_sid}_{recording_sid}.wav"), &wav).await
}

/// Writes `wav` as `<recordings>/<date>/<name>` (through a temporary file),
/// the path contained in `recordings`.
async fn save(
    recordings: &Path,
    date: &str,
    name: &str,
    wav: &[u8],
) -> Result<PathBuf, RecordingError> {
    let save_err = |e: &dyn std::fmt::Display| RecordingError::Save(e.to_string());
    tokio::fs::create_dir_all(recordings).await.map_err(|e| save_err(&e))?;
    let relative = Path::new(date).join(name);
    let path =
        lemon_core::contain::resolve_inside(&[recordings], &relative).map_err(|e| save_err(&e))?;
    let dir = path.parent().ok_or_else(|| RecordingError::Save("no directory".into()))?;
    tokio::fs::create_dir_all(dir).await.map_err(|e| save_err(&e))?;
    let partial = path.with_extension("wav.partial");
    tokio::fs::write(&partial, wav).await.map_err(|e| save_err(&e))?;
    tokio::fs::rename(&partial, &path).await.map_err(|e| save_err(&e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav() -> Vec<u8> {
        let mut out = b"RIFF".to_vec();
        out.extend(36u32.to_le_bytes());
        out.extend(b"WAVEfmt ");
        out.extend(16u32.to_le_bytes());
        out.extend([7, 0, 2, 0]);
        out.extend(8000u32.to_le_bytes());
        out.extend(16000u32.to_le_bytes());
        out.extend([2, 0, 8, 0]);
        out.extend(b"data");
        out.extend(0u32.to_le_bytes());
        out
    }

    #[test]
    fn only_riff_wave_files_are_wav() {
        assert!(is_wav(&wav()));
        assert!(!is_wav(b"ID3\x03 not a wav at all, an mp3 header and some padding bytes"));
        assert!(!is_wav(&wav()[..20]));
    }

    #[tokio::test]
    async fn a_recording_is_saved_under_its_date_and_never_outside() {
        let dir = tempfile_dir();
        let path = save(&dir, "2026-12-01", "CA1_RE1.wav", &wav()).await.unwrap();
        assert_eq!(path, dir.canonicalize().unwrap().join("2026-12-01").join("CA1_RE1.wav"));
        assert_eq!(std::fs::read(&path).unwrap(), wav());
        assert!(save(&dir, "..", "x.wav", &wav()).await.is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lemon-voice-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
