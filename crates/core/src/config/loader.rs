//! Reading `config.toml`.

use std::path::{Path, PathBuf};

use super::Config;

/// A config file that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    Read { path: PathBuf, message: String },
}

/// A loaded config and the warnings (unknown keys…) found while loading it.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    pub warnings: Vec<String>,
}

/// # Errors
/// [`ConfigError`] naming the file, line and column.
pub fn load_str(text: &str, path: &Path) -> Result<LoadedConfig, ConfigError> {
    let config = toml::from_str(text).map_err(|e: toml::de::Error| ConfigError::Read {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    Ok(LoadedConfig { config, warnings: Vec::new() })
}

/// # Errors
/// [`ConfigError`] naming the file, line and column.
pub fn load_file(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Read { path: path.to_owned(), message: e.to_string() })?;
    load_str(&text, path)
}
